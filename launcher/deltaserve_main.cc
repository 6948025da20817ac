// build/bin/deltaserve: one binary, several subcommands.
#include <cstdio>
#include <cstring>
#include <string>

#include "launcher/commands.h"
#include "launcher/deployment.h"
#include "runtime/common/build_config.h"
#if DELTASERVE_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

namespace {

constexpr char kUsage[] =
    "usage: deltaserve COMMAND [flags]\n"
    "commands:\n"
    "  make-model --preset NAME|--config FILE --out DIR [--seed N]\n"
    "  generate   --model DIR (--prompt TEXT | --tokens 1,2,3) [--max-tokens N]\n"
    "             [--temperature T --top-k K --top-p P --seed S]\n"
    "             [--prefill-chunk N --threads N --ids --stats --ignore-eos]\n"
    "  score      --model DIR (--tokens 1,2,3 | --tokens-file F)\n"
    "             --logits-out OUT.safetensors [--prefill-chunk N --decode-from K]\n"
    "             [--threads N --stats]\n"
    "  (generate and score run distributed under mpirun/srun:\n"
    "   --pp N --tp M [--stage-layers 2,3,4]; world size = N * M)\n"
    "  plan       (--model DIR | --config FILE) --pp N --tp M [--context T]\n"
    "             [--stage-layers 2,3,4] [--weight-bytes 4 --cache-bytes 4]\n"
    "             [--state-bytes 4 --activation-bytes 4]\n"
    "  serve      --model DIR [--port 50051 --host 127.0.0.1 --metrics-port N]\n"
    "             [--threads N] [coordinator limits below]: API and worker in one process\n"
    "  coordinator --model DIR [--port 50051 --host 0.0.0.0 --metrics-port N]\n"
    "             [--max-running 64 --max-waiting 1024 --max-waiting-tokens N]\n"
    "             [--step-tokens 512 --max-request-bytes N --port-file F]\n"
    "  worker     --coordinator HOST:PORT --model DIR [--pp N --tp M --threads N]\n"
    "             (one rank per process: mpirun -np N*M deltaserve worker ...)\n"
    "  client     generate|score|info|status [--server HOST:PORT] ...\n"
    "  bench-serve --server HOST:PORT [--concurrency 1,8,32 --prompt-tokens N]\n"
    "             [--max-tokens N --requests N --compare-model DIR --threads N]\n"
    "  version\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const deltaserve::Args args(argv + 2, argv + argc);
  absl::Status status;
  if (command == "make-model") {
    status = deltaserve::RunMakeModel(args);
  } else if (command == "generate") {
    status = deltaserve::RunGenerate(args);
  } else if (command == "score") {
    status = deltaserve::RunScore(args);
  } else if (command == "plan") {
    status = deltaserve::RunPlan(args);
  } else if (command == "serve") {
    status = deltaserve::RunServe(args);
  } else if (command == "coordinator") {
    status = deltaserve::RunCoordinator(args);
  } else if (command == "worker") {
    status = deltaserve::RunWorkerCommand(args);
  } else if (command == "client") {
    status = deltaserve::RunClient(args);
  } else if (command == "bench-serve") {
    status = deltaserve::RunBenchServe(args);
  } else if (command == "version") {
    std::printf("deltaserve %s (cuda=%d mpi=%d)\n", DELTASERVE_VERSION, DELTASERVE_HAVE_CUDA,
                DELTASERVE_HAVE_MPI);
#if DELTASERVE_HAVE_CUDA
    std::string error;
    const auto devices = deltaserve::kernels::ListCudaDevices(&error);
    if (!error.empty()) std::printf("cuda: no usable device (%s)\n", error.c_str());
    for (const auto& d : devices) {
      std::printf("cuda device %d: %s, compute %d.%d, %.1f GiB\n", d.index, d.name.c_str(),
                  d.compute_major, d.compute_minor, d.memory_bytes / 1073741824.0);
    }
#endif
  } else {
    std::fprintf(stderr, "deltaserve: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "deltaserve %s: error: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
  }
  deltaserve::EndDeployment(status.ok());
  return status.ok() ? 0 : 1;
}
