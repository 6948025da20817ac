// --help everywhere: `deltaserve --help` lists the commands, and every
// command, subcommand and benchmark program answers --help with its usage,
// flags and an example, exit code 0, without doing any work.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

std::string Shell(const std::string& command, int* rc) {
  std::string output;
  *rc = testing::RunCommand(command, &output);
  return output;
}

// The command names of a "commands:" section: the first word of each
// indented line up to the next blank line.
std::vector<std::string> ListedCommands(const std::string& help) {
  std::vector<std::string> names;
  std::istringstream in(help.substr(help.find("commands:\n") + 10));
  std::string line;
  while (std::getline(in, line) && !line.empty()) {
    std::istringstream words(line);
    std::string word;
    words >> word;
    names.push_back(word);
  }
  return names;
}

TEST(HelpTest, TopLevelHelpListsEveryCommand) {
  int rc = 0;
  const std::string help = Shell(testing::BinPath("deltaserve") + " --help", &rc);
  EXPECT_EQ(rc, 0) << help;
  const std::vector<std::string> names = ListedCommands(help);
  for (const char* expected : {"make-model", "generate", "score", "batch", "plan", "serve",
                               "coordinator", "worker", "client", "bench-serve", "version"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end())
        << expected << " missing from\n"
        << help;
  }
  // `help` and no arguments: the same list (the latter an error).
  EXPECT_EQ(Shell(testing::BinPath("deltaserve") + " help 2>&1", &rc), help);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(Shell(testing::BinPath("deltaserve") + " 2>&1", &rc), help);
  EXPECT_EQ(rc, 2);
}

TEST(HelpTest, EveryCommandAnswersHelpWithFlagsAndAnExample) {
  int rc = 0;
  const std::string top = Shell(testing::BinPath("deltaserve") + " --help", &rc);
  for (const std::string& name : ListedCommands(top)) {
    SCOPED_TRACE(name);
    // The flags of a model command come before anything is loaded: a model
    // directory that does not exist does not matter.
    const std::string help =
        Shell(absl::StrCat(testing::BinPath("deltaserve"), " ", name, " --help 2>&1"), &rc);
    EXPECT_EQ(rc, 0) << help;
    EXPECT_EQ(help.rfind(absl::StrCat("deltaserve ", name, ": "), 0), 0u) << help;
    EXPECT_NE(help.find(absl::StrCat("usage: deltaserve ", name)), std::string::npos) << help;
    EXPECT_NE(help.find("example"), std::string::npos) << help;
    if (name == "client") {
      // Its subcommands, each with its own flags.
      for (const char* sub : {"generate", "score", "info", "status"}) {
        const std::string sub_help =
            Shell(absl::StrCat(testing::BinPath("deltaserve"), " client ", sub, " --help"), &rc);
        EXPECT_EQ(rc, 0) << sub_help;
        EXPECT_NE(sub_help.find("--server HOST:PORT"), std::string::npos) << sub_help;
        EXPECT_NE(sub_help.find("(default: 127.0.0.1:50051)"), std::string::npos) << sub_help;
      }
      continue;
    }
    if (name != "version") {
      EXPECT_NE(help.find("flags:\n  --"), std::string::npos) << help;
      EXPECT_NE(help.find("(default: "), std::string::npos) << help;
    }
  }
  // -h, --help after other flags, and `help CMD`.
  const std::string coordinator =
      Shell(testing::BinPath("deltaserve") + " coordinator --help", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(coordinator.find("--max-running N"), std::string::npos) << coordinator;
  EXPECT_EQ(Shell(testing::BinPath("deltaserve") + " coordinator -h", &rc), coordinator);
  EXPECT_EQ(Shell(testing::BinPath("deltaserve") + " coordinator --port 7 --help", &rc),
            coordinator);
  EXPECT_EQ(Shell(testing::BinPath("deltaserve") + " help coordinator", &rc), coordinator);
  // "--help" as the value of a flag is that value, not a request for help.
  const std::string as_value = Shell(
      testing::BinPath("deltaserve") + " generate --model /nonexistent --prompt --help 2>&1", &rc);
  EXPECT_EQ(rc, 1) << as_value;
  EXPECT_NE(as_value.find("/nonexistent"), std::string::npos) << as_value;
}

TEST(HelpTest, BenchmarkProgramsPrintUsageInsteadOfRunning) {
  if (!std::filesystem::exists(testing::BinPath("model_bench"))) {
    GTEST_SKIP() << "built without the benchmarks (DELTASERVE_BENCH=OFF)";
  }
  for (const std::string& program :
       {testing::BinPath("model_bench") + " --help", testing::BinPath("kda_bench") + " --help",
        testing::BinPath("skinny_bench") + " --help", testing::BinPath("link_emulator") + " --help",
        std::string("bash bench/pipeline_bench.sh --help"),
        std::string("bash bench/serve_bench.sh --help"),
        std::string("bash bench/coordinator_pipeline_bench.sh -h"),
        std::string("bash bench/million_prefill.sh --help"),
        std::string("bash bench/pipeline_decode_bench.sh --help"),
        std::string("bash bench/llamacpp_compare.sh --help"),
        std::string("bash bench/network_bench.sh --help"),
        std::string("bash bench/prefix_cache_bench.sh --help"),
        std::string("python3 bench/fla_kda_compare.py --help")}) {
    SCOPED_TRACE(program);
    const auto start = std::chrono::steady_clock::now();
    int rc = 0;
    const std::string help = Shell(program, &rc);
    EXPECT_EQ(rc, 0) << help;
    EXPECT_NE(help.find("bench"), std::string::npos) << help;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "it ran";
  }
  int rc = 0;
  const std::string bad = Shell(testing::BinPath("model_bench") + " --bogus 1 2>&1", &rc);
  EXPECT_EQ(rc, 2) << bad;
  EXPECT_NE(bad.find("unknown flag --bogus"), std::string::npos) << bad;
}

}  // namespace
}  // namespace deltaserve
