// build/bin/deltaserve: one binary, several subcommands.
#include <cstdio>
#include <cstring>
#include <string>

#include "launcher/commands.h"
#include "runtime/common/build_config.h"

namespace {

constexpr char kUsage[] =
    "usage: deltaserve COMMAND [flags]\n"
    "commands:\n"
    "  make-model --preset NAME|--config FILE --out DIR [--seed N]\n"
    "  generate   --model DIR (--prompt TEXT | --tokens 1,2,3) [--max-tokens N]\n"
    "             [--temperature T --top-k K --top-p P --seed S]\n"
    "             [--prefill-chunk N --threads N --ids]\n"
    "  score      --model DIR (--tokens 1,2,3 | --tokens-file F)\n"
    "             --logits-out OUT.safetensors [--prefill-chunk N --threads N]\n"
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
  } else if (command == "version") {
    std::printf("deltaserve %s (cuda=%d mpi=%d)\n", DELTASERVE_VERSION,
                DELTASERVE_HAVE_CUDA, DELTASERVE_HAVE_MPI);
  } else {
    std::fprintf(stderr, "deltaserve: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "deltaserve %s: error: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
