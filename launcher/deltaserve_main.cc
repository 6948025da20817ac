// build/bin/deltaserve: one binary, several subcommands.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/ops.h"
#include "launcher/commands.h"
#include "launcher/deployment.h"
#include "runtime/common/build_config.h"
#include "runtime/common/status_macros.h"
#if DELTASERVE_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

namespace deltaserve {
namespace {

struct Command {
  const CommandSpec& (*spec)();
  absl::Status (*run)(const Args& args);
};

const CommandSpec& VersionSpec() {
  static const auto* spec = new CommandSpec{
      .name = "version",
      .summary = "the version, the features built in (CUDA, MPI) and the CUDA devices",
      .examples = {"deltaserve version"},
  };
  return *spec;
}

absl::Status RunVersion(const Args& args) {
  DELTASERVE_RETURN_IF_ERROR(Flags::Parse(VersionSpec(), args).status());
  std::printf("deltaserve %s (cuda=%d mpi=%d)\n", DELTASERVE_VERSION, DELTASERVE_HAVE_CUDA,
              DELTASERVE_HAVE_MPI);
#if DELTASERVE_HAVE_CUDA
  std::string error;
  const auto devices = kernels::ListCudaDevices(&error);
  if (!error.empty()) std::printf("cuda: no usable device (%s)\n", error.c_str());
  for (const auto& d : devices) {
    std::printf("cuda device %d: %s, compute %d.%d, %.1f GiB\n", d.index, d.name.c_str(),
                d.compute_major, d.compute_minor, d.memory_bytes / 1073741824.0);
  }
#endif
  // What the CUDA ops run on: a GPU, the host SIMT harness
  // (DELTASERVE_CUDA_BACKEND=sim), or nothing, and why.
  const kernels::cuda::Backend backend = kernels::cuda::ActiveBackend();
  std::printf("cuda ops: %s%s%s\n", kernels::cuda::BackendName(backend),
              backend == kernels::cuda::Backend::kNone ? ": " : "",
              kernels::cuda::BackendProblem().c_str());
  return absl::OkStatus();
}

// In the order `deltaserve --help` lists them.
const Command kCommands[] = {
    {MakeModelSpec, RunMakeModel},
    {GenerateSpec, RunGenerate},
    {ScoreSpec, RunScore},
    {BatchSpec, RunBatch},
    {PlanSpec, RunPlan},
    {ServeSpec, RunServe},
    {CoordinatorSpec, RunCoordinator},
    {WorkerSpec, RunWorkerCommand},
    {ClientSpec, RunClient},
    {BenchServeSpec, RunBenchServe},
    {VersionSpec, RunVersion},
};

std::string Usage() {
  std::string out =
      "usage: deltaserve COMMAND [flags]\n"
      "\n"
      "commands:\n";
  for (const Command& c : kCommands) {
    std::string name = c.spec().name;
    name.resize(std::max<size_t>(name.size() + 1, 13), ' ');
    absl::StrAppend(&out, "  ", name, c.spec().summary, "\n");
  }
  out +=
      "\n"
      "`deltaserve COMMAND --help` shows a command's flags, defaults and an example.\n"
      "generate, score, batch and worker run as MPI jobs under mpirun/srun (--pp N --tp M).\n";
  return out;
}

const Command* Find(const std::string& name) {
  for (const Command& c : kCommands) {
    if (c.spec().name == name) return &c;
  }
  return nullptr;
}

// The spec that answers `args`' --help: a subcommand's when args name one.
const CommandSpec& HelpSpec(const CommandSpec& spec, Args* args) {
  if (args->empty()) return spec;
  for (const CommandSpec* sub : spec.subcommands) {
    if (sub->name == absl::StrCat(spec.name, " ", (*args)[0])) {
      args->erase(args->begin());
      return *sub;
    }
  }
  return spec;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(Usage().c_str(), stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    // `deltaserve help CMD` is `deltaserve CMD --help`.
    if (argc > 2 && command == "help") {
      if (const Command* c = Find(argv[2])) {
        Args rest(argv + 3, argv + argc);
        std::fputs(HelpText(HelpSpec(c->spec(), &rest)).c_str(), stdout);
        return 0;
      }
    }
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  const Command* c = Find(command);
  if (c == nullptr) {
    std::fprintf(stderr, "deltaserve: unknown command '%s'\n%s", command.c_str(), Usage().c_str());
    return 2;
  }
  const Args args(argv + 2, argv + argc);
  Args rest = args;
  const CommandSpec& help = HelpSpec(c->spec(), &rest);
  if (WantsHelp(help, rest)) {
    std::fputs(HelpText(help).c_str(), stdout);
    return 0;
  }
  const absl::Status status = c->run(args);
  if (!status.ok()) {
    std::fprintf(stderr, "deltaserve %s: error: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
  }
  EndDeployment(status.ok());
  return status.ok() ? 0 : 1;
}

}  // namespace
}  // namespace deltaserve

int main(int argc, char** argv) { return deltaserve::Main(argc, argv); }
