// build/bin/deltaserve run as real MPI jobs (mpirun, 2-4 processes): every
// pipeline x tensor-parallel layout gives the single process's logits, the
// bytes crossing each stage boundary are what the planner predicts, and bad
// layouts and dead ranks end the job with a clear message instead of a hang.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/scheduler/stage_plan.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

namespace fs = std::filesystem;

// Several ranks share two cores: one thread each keeps them from stalling
// each other's OpenMP teams.
std::string Mpirun(int np) {
  return absl::StrCat("mpirun --allow-run-as-root --oversubscribe -np ", np, " ",
                      testing::BinPath("deltaserve"));
}

std::string WriteTokens(const std::string& dir, const std::vector<int32_t>& tokens) {
  const std::string path = dir + "/tokens.txt";
  std::ofstream(path) << absl::StrJoin(tokens, " ");
  return path;
}

std::vector<float> ReadLogits(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto view = (*file)->Get("logits");
  EXPECT_TRUE(view.ok()) << view.status();
  return view.ok() ? *ToFloat32(**view) : std::vector<float>{};
}

// Runs `launcher score ... args` and returns the logits it wrote.
std::vector<float> Score(const std::string& launcher, const std::string& model,
                         const std::string& tokens_file, const std::string& args,
                         std::string* output = nullptr) {
  const std::string dir = testing::TempDir("dist_score");
  const std::string out = dir + "/logits.safetensors";
  std::string log;
  const int rc = testing::RunCommand(
      absl::StrCat(launcher, " score --threads 1 --model ", model, " --tokens-file ", tokens_file,
                   " --logits-out ", out, " ", args),
      &log);
  EXPECT_EQ(rc, 0) << log;
  if (output != nullptr) *output = log;
  return rc == 0 ? ReadLogits(out) : std::vector<float>{};
}

struct Layout {
  int pp, tp;
  std::string stage_layers;  // empty: the planner's split
  int np() const { return pp * tp; }
  std::string Flags() const {
    std::string f = absl::StrCat("--pp ", pp, " --tp ", tp);
    if (!stage_layers.empty()) absl::StrAppend(&f, " --stage-layers ", stage_layers);
    return f;
  }
};

class DistributedTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DistributedTest, EveryLayoutMatchesOneProcess) {
  const std::string model = testing::GoldenPath("model/" + GetParam());
  const std::string dir = testing::TempDir("dist_layouts");
  // The golden prompt, whose float64 logits say how accurate float32 can be.
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  const std::string tokens =
      WriteTokens(dir, std::vector<int32_t>(golden.tokens.begin(), golden.tokens.end()));
  const Layout layouts[] = {{2, 1, ""}, {1, 2, ""}, {2, 2, ""}, {4, 1, ""}, {3, 1, "2,3,4"}};
  // One-shot prefill, chunked prefill, and prefill of 100 then decode of 50.
  const std::string modes[] = {"", "--prefill-chunk 7", "--prefill-chunk 64 --decode-from 100"};
  for (const std::string& mode : modes) {
    const auto single = Score(testing::BinPath("deltaserve"), model, tokens, mode);
    const auto reference = testing::ToDouble(single);
    ASSERT_EQ(reference.size(), golden.logits.size());
    const double float32_error = testing::RelL2(single, golden.logits);
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(absl::StrCat(layout.Flags(), " ", mode));
      const double err = testing::RelL2(
          Score(Mpirun(layout.np()), model, tokens, absl::StrCat(layout.Flags(), " ", mode)),
          reference);
      std::printf("%s %s %s: relative L2 %.3g (single process vs float64 %.3g)\n",
                  GetParam().c_str(), layout.Flags().c_str(), mode.c_str(), err, float32_error);
      if (layout.tp == 1) {
        // Stages run the very same arithmetic as one process.
        EXPECT_LE(err, 1e-5);
      } else {
        // TP sums o_proj and FFN partials in another order: another float32
        // evaluation of the same model. k3-tiny's random weights amplify
        // rounding to a few 1e-5 (docs/numerics.md), so the bound is 1e-5 or
        // twice the single process's own float32 error, whichever is larger.
        EXPECT_LE(err, std::max(1e-5, 2 * float32_error));
      }
    }
  }
}

TEST_P(DistributedTest, LongPromptInPipelinedChunksEqualsOneShot) {
  const std::string model = testing::GoldenPath("model/" + GetParam());
  const std::string dir = testing::TempDir("dist_long");
  const std::string tokens = WriteTokens(dir, testing::RandomTokens(5000, 11));
  const auto one_shot = testing::ToDouble(Score(testing::BinPath("deltaserve"), model, tokens, ""));
  const auto pipelined = Score(Mpirun(2), model, tokens, "--pp 2 --tp 1 --prefill-chunk 512");
  // Chunks (KDA chunk boundaries, MLA prefix attention) against one shot: the
  // invariance bound of tests/runtime/engine/invariance_test.cc.
  EXPECT_LE(testing::RelL2(pipelined, one_shot), 5e-5);
}

TEST_P(DistributedTest, BoundaryBytesAreWhatThePlannerPredicts) {
  const std::string model = testing::GoldenPath("model/" + GetParam());
  auto config = LoadModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string dir = testing::TempDir("dist_bytes");
  const int64_t T = 200;
  const std::string tokens = WriteTokens(dir, testing::RandomTokens(T, 5));
  for (const std::string counts : {"2,3,4", "5,2,2"}) {
    std::string log;
    Score(Mpirun(6), model, tokens,
          absl::StrCat("--pp 3 --tp 2 --stage-layers ", counts, " --prefill-chunk 64 --stats"),
          &log);
    std::vector<int64_t> layer_counts;
    for (char c : counts) {
      if (c != ',') layer_counts.push_back(c - '0');
    }
    auto plan = StagesFromCounts(*config, layer_counts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const auto report = ReportPlan(*config, *plan, 2, T, PlanBytes{});
    ASSERT_TRUE(report.ok()) << report.status();
    const int64_t checkpoint_bytes =
        static_cast<int64_t>(fs::file_size(model + "/model.safetensors"));
    for (int stage = 0; stage < 3; ++stage) {
      for (int tp = 0; tp < 2; ++tp) {
        // Each rank reads only its layers' slices of the checkpoint.
        const std::regex read(
            absl::StrCat("rank ", stage * 2 + tp, ": .*read (\\d+) checkpoint bytes"));
        std::smatch read_match;
        ASSERT_TRUE(std::regex_search(log, read_match, read)) << log;
        EXPECT_GT(std::stoll(read_match[1]), 0);
        EXPECT_LT(std::stoll(read_match[1]), checkpoint_bytes / 2) << "rank " << stage * 2 + tp;
        // "rank R: stage S (...), tp X of 2: ... sent N bytes for M tokens"
        const std::regex line(absl::StrCat("rank ", stage * 2 + tp, ": stage ", stage,
                                           " .*sent (\\d+) bytes for (\\d+) tokens"));
        std::smatch match;
        ASSERT_TRUE(std::regex_search(log, match, line)) << log;
        const int64_t sent = std::stoll(match[1]), sent_tokens = std::stoll(match[2]);
        EXPECT_EQ(sent_tokens, stage < 2 ? T : 0);
        EXPECT_EQ(sent, (*report)[stage].boundary_bytes_per_token * sent_tokens)
            << "stage " << stage;
      }
    }
  }
}

// --boundary-dtype bf16: the stages send half the bytes (the planner's
// activation bytes at 2), and the logits move by the rounding of what
// crosses, within a bound measured on the goldens (docs/numerics.md).
TEST_P(DistributedTest, ABf16BoundaryHalvesTheBytesWithinItsBound) {
  const std::string model = testing::GoldenPath("model/" + GetParam());
  auto config = LoadModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  const testing::GoldenLogits golden = testing::LoadGoldenLogits(GetParam());
  const std::string dir = testing::TempDir("dist_bf16");
  const std::string tokens =
      WriteTokens(dir, std::vector<int32_t>(golden.tokens.begin(), golden.tokens.end()));
  const int64_t T = static_cast<int64_t>(golden.tokens.size());
  const auto reference =
      testing::ToDouble(Score(testing::BinPath("deltaserve"), model, tokens, ""));
  for (const Layout& layout : {Layout{2, 1, ""}, Layout{4, 1, ""}}) {
    SCOPED_TRACE(layout.Flags());
    std::string log;
    const std::vector<float> logits =
        Score(Mpirun(layout.np()), model, tokens,
              absl::StrCat(layout.Flags(), " --boundary-dtype bf16 --stats"), &log);
    const double err = testing::RelL2(logits, reference);
    // Positions whose top token is the float32 boundary's.
    const int64_t V = config->vocab_size;
    int64_t same = 0;
    for (int64_t t = 0; t < T && logits.size() == reference.size(); ++t) {
      const auto row = logits.begin() + t * V;
      const auto want = reference.begin() + t * V;
      same += std::max_element(row, row + V) - row == std::max_element(want, want + V) - want;
    }
    std::printf(
        "%s %s --boundary-dtype bf16: relative L2 %.3g against f32, top token equal at "
        "%lld of %lld positions\n",
        GetParam().c_str(), layout.Flags().c_str(), err, static_cast<long long>(same),
        static_cast<long long>(T));
    EXPECT_GT(err, 0);  // the boundary did round
    // The tiny random models amplify rounding (k3-tiny about 300-fold,
    // docs/numerics.md): measured up to 0.21, and the top token kept at 129
    // of 150 positions, here.
    EXPECT_LE(err, 0.3);
    EXPECT_GE(same, T * 8 / 10);
    std::vector<int64_t> counts;
    for (int stage = 0; stage < layout.pp; ++stage) {
      std::smatch m;
      const std::regex line(absl::StrCat("rank ", stage, ": stage ", stage,
                                         " \\(layers (\\d+)-(\\d+)\\).*sent (\\d+) bytes"));
      ASSERT_TRUE(std::regex_search(log, m, line)) << log;
      counts.push_back(std::stoll(m[2]) - std::stoll(m[1]) + 1);
    }
    auto plan = StagesFromCounts(*config, counts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const auto report = ReportPlan(*config, *plan, 1, T, PlanBytes{.activation = 2});
    ASSERT_TRUE(report.ok()) << report.status();
    for (int stage = 0; stage + 1 < layout.pp; ++stage) {
      std::smatch m;
      const std::regex line(
          absl::StrCat("rank ", stage, ": stage ", stage, " .*sent (\\d+) bytes"));
      ASSERT_TRUE(std::regex_search(log, m, line)) << log;
      EXPECT_EQ(std::stoll(m[1]), (*report)[stage].boundary_bytes_per_token * T) << stage;
    }
  }
}

TEST_P(DistributedTest, GenerateStreamsTheSameTokens) {
  const std::string model = testing::GoldenPath("model/" + GetParam());
  const std::string args = absl::StrCat(" generate --threads 1 --ids --max-tokens 12 --model ",
                                        model, " --tokens 5,17,99,3,250,8,1 ");
  for (const std::string sampling : {"", "--temperature 0.9 --top-k 50 --top-p 0.95 --seed 4"}) {
    std::string single, distributed;
    ASSERT_EQ(
        testing::RunCommand(
            absl::StrCat(testing::BinPath("deltaserve"), args, sampling, " 2>/dev/null"), &single),
        0)
        << single;
    ASSERT_EQ(testing::RunCommand(absl::StrCat(Mpirun(4), args, sampling,
                                               " --pp 2 --tp 2 --prefill-chunk 3 2>/dev/null"),
                                  &distributed),
              0)
        << distributed;
    // Printed once, by the last stage's first TP rank.
    EXPECT_EQ(distributed, single) << sampling;
    EXPECT_EQ(std::count(single.begin(), single.end(), ' '), 11) << single;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, DistributedTest, ::testing::ValuesIn(testing::kGoldenModels),
                         testing::GoldenTestName);
INSTANTIATE_TEST_SUITE_P(GoldenMxfp4, DistributedTest,
                         ::testing::ValuesIn(testing::kMxfp4GoldenModels), testing::GoldenTestName);

// The model on the CUDA device of every rank, here the SIMT harness's: the
// weights, activations and state in device memory, the activation packets
// and TP sums copied through host memory. One process and a 2 x 2 job give
// the CPU's logits; a short prompt keeps the harness's slowness in bounds.
TEST(DistributedCudaTest, EveryRankOnTheDeviceMatchesOneCpuProcess) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("dist_cuda");
  const testing::GoldenLogits golden = testing::LoadGoldenLogits("k3-tiny");
  const std::string tokens =
      WriteTokens(dir, std::vector<int32_t>(golden.tokens.begin(), golden.tokens.begin() + 70));
  const std::vector<float> single = Score(testing::BinPath("deltaserve"), model, tokens, "");
  const std::vector<double> reference = testing::ToDouble(single);
  const double float32_error = testing::RelL2(
      single, std::vector<double>(golden.logits.begin(), golden.logits.begin() + 70 * 256));
  const std::string device =
      "--device cuda --kv-cache-tokens 4096 --kv-state-slots 4 --prefill-chunk 66";
  const std::string sim = "DELTASERVE_CUDA_BACKEND=sim ";
  std::string log;
  // Chunks of 66: a prefill chunk across the first page, then a short one.
  EXPECT_LE(
      testing::RelL2(Score(sim + testing::BinPath("deltaserve"), model, tokens, device), reference),
      5e-5);
  // TP sums in another order: the bound of the CPU's TP layouts above.
  EXPECT_LE(testing::RelL2(Score(sim + Mpirun(4), model, tokens, "--pp 2 --tp 2 " + device, &log),
                           reference),
            std::max(5e-5, 2 * float32_error))
      << log;
}

// --device names a device this process can use, or the command stops
// before loading anything, saying why.
TEST(DistributedCudaTest, ADeviceThatCannotBeUsedIsRefusedNamingIt) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("dist_cuda_bad");
  const std::string cases[][2] = {
      {"DELTASERVE_CUDA_BACKEND=off ",
       "--device cuda: DELTASERVE_CUDA_BACKEND is 'off'; it is gpu or sim"},
      {"DELTASERVE_CUDA_BACKEND=sim ",
       "--device cuda:1: this machine has 1 CUDA device (cuda:0 to cuda:0)"},
      {"", "--device is 'gpu'; it must be cpu, cuda or cuda:N"},
  };
  const std::string flags[] = {"--device cuda", "--device cuda:1", "--device gpu"};
  for (int i = 0; i < 3; ++i) {
    std::string log;
    const int rc = testing::RunCommand(
        absl::StrCat(cases[i][0], testing::BinPath("deltaserve"), " score --model ", model,
                     " --tokens 1,2,3 ", flags[i], " --logits-out ", dir, "/x.safetensors"),
        &log);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(log.find(cases[i][1]), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
  }
}

TEST(DistributedErrorsTest, LayoutNotMatchingTheWorldIsRefused) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("dist_refuse");
  for (const auto& [np, flags] : std::vector<std::pair<int, std::string>>{
           {3, "--pp 2 --tp 2"}, {2, "--pp 1 --tp 1"}, {4, "--pp 3 --tp 1"}}) {
    std::string log;
    const int rc = testing::RunCommand(
        absl::StrCat(Mpirun(np), " score --threads 1 --model ", model, " --tokens 1,2,3 ", flags,
                     " --logits-out ", dir, "/x.safetensors"),
        &log);
    EXPECT_NE(rc, 0) << log;
    EXPECT_NE(log.find(absl::StrCat("but the MPI world has ", np)), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
  }
}

// The PID of the process whose command line contains `marker` and whose MPI
// rank is `rank`, or -1.
pid_t FindRank(const std::string& marker, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmdline(entry.path() / "cmdline"), environ(entry.path() / "environ");
    std::string cmd((std::istreambuf_iterator<char>(cmdline)), {});
    std::string env((std::istreambuf_iterator<char>(environ)), {});
    if (cmd.find(marker) == std::string::npos || cmd.find("mpirun") != std::string::npos) {
      continue;
    }
    if (env.find(absl::StrCat("OMPI_COMM_WORLD_RANK=", rank, std::string(1, '\0'))) !=
        std::string::npos) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
}

TEST(DistributedErrorsTest, DeadRankEndsTheJobNamingIt) {
  // A long run (token-by-token prefill of 50000 tokens over 2 stages), one
  // rank killed once both are working: the job must end, non-zero, naming the
  // rank, within seconds.
  const std::string model = testing::GoldenPath("model/kimi-linear-tiny");
  const std::string dir = testing::TempDir("dist_dead");
  const std::string tokens = WriteTokens(dir, testing::RandomTokens(50000, 3));
  const std::string log = dir + "/job.log";
  const std::string cmd = absl::StrCat(
      Mpirun(2), " score --threads 1 --pp 2 --model ", model, " --tokens-file ", tokens,
      " --prefill-chunk 1 --logits-out ", dir, "/x.safetensors > ", log, " 2>&1");
  const pid_t job = fork();
  ASSERT_GE(job, 0);
  if (job == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  pid_t victim = -1;
  for (int i = 0; i < 100 && victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    victim = FindRank(dir, 1);
  }
  ASSERT_GT(victim, 0) << "rank 1 never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // mid-run
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(job, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    kill(job, SIGKILL);
    waitpid(job, &status, 0);
    FAIL() << "the job was still running 30 s after rank 1 died";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds, 10.0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir + "/x.safetensors"));
}

}  // namespace
}  // namespace deltaserve
