// `deltaserve score` on long documents: --logprobs-out gives each token's
// log-prob (and top-k alternatives) equal to the log-softmax of --logits-out,
// --window scores independent windows,
// holds one piece's logits at a time (a 1,048,576-token document, its peak
// logits buffer and the process's peak memory measured), and --logits-out
// refuses what would not fit, naming the size.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/safetensors.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

std::string Deltaserve() { return testing::BinPath("deltaserve"); }

// A tensor of a safetensors file, as float64 values.
std::vector<double> Read(const std::string& path, const std::string& name,
                         std::vector<int64_t>* shape = nullptr) {
  const std::optional<testing::GoldenFile> file = testing::ReadGoldenFile(path);
  if (!file) return {};
  const testing::GoldenTensor& t = file->Get(name);
  if (shape != nullptr) *shape = t.shape;
  return t.values;
}

// log-softmax of row `row` of logits [T, vocab], in double.
std::vector<double> LogSoftmaxRow(const std::vector<double>& logits, int64_t vocab, int64_t row) {
  const double* x = logits.data() + row * vocab;
  const double max = *std::max_element(x, x + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(x[i] - max);
  std::vector<double> out(vocab);
  for (int64_t i = 0; i < vocab; ++i) out[i] = x[i] - max - std::log(sum);
  return out;
}

// Every log-prob and top-k entry of `logprobs_file` against the log-softmax
// of `logits_file`'s rows, for the first `rows` positions, within `tol`.
void ExpectLogprobsMatchLogits(const std::string& logprobs_file, const std::string& logits_file,
                               int64_t rows, int64_t top_k, double tol) {
  std::vector<int64_t> shape;
  const std::vector<double> logits = Read(logits_file, "logits", &shape);
  ASSERT_EQ(shape.size(), 2u);
  const int64_t vocab = shape[1];
  const std::vector<double> tokens = Read(logits_file, "tokens");
  const std::vector<double> lp = Read(logprobs_file, "logprobs");
  const std::vector<double> top_ids = Read(logprobs_file, "top_ids");
  const std::vector<double> top_lp = Read(logprobs_file, "top_logprobs");
  ASSERT_GE(static_cast<int64_t>(lp.size()), rows);
  ASSERT_GE(static_cast<int64_t>(top_ids.size()), rows * top_k);
  for (int64_t i = 0; i < rows; ++i) {
    const std::vector<double> want = LogSoftmaxRow(logits, vocab, i);
    EXPECT_NEAR(lp[i], want[static_cast<int64_t>(tokens[i + 1])], tol) << "position " << i;
    std::vector<int64_t> order(vocab);
    for (int64_t v = 0; v < vocab; ++v) order[v] = v;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return want[a] > want[b]; });
    for (int64_t j = 0; j < top_k; ++j) {
      EXPECT_NEAR(top_lp[i * top_k + j], want[order[j]], tol) << "position " << i;
      // The id where no neighbour is within the tolerance of it (near-ties
      // may swap when the runs round differently).
      const bool clear = (j == 0 || want[order[j - 1]] - want[order[j]] > 2 * tol) &&
                         (j + 1 == vocab || want[order[j]] - want[order[j + 1]] > 2 * tol);
      if (clear) {
        EXPECT_EQ(top_ids[i * top_k + j], order[j]) << "position " << i << ", rank " << j;
      }
    }
  }
}

TEST(ScoreCliTest, LogprobsAndTopKEqualTheLogSoftmaxOfTheLogits) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("score_logprobs");
  const std::vector<int32_t> tokens = testing::RandomTokens(150, 4);
  const std::string ids = absl::StrJoin(tokens, ",");
  std::string output;
  for (const char* chunk : {"0", "7", "64"}) {
    // The logits cut the same way (0: one piece for both at 150 tokens), so
    // the two differ by the rounding of a float32 log-prob only.
    const std::string logits = absl::StrCat(dir, "/logits_", chunk, ".safetensors");
    ASSERT_EQ(
        testing::RunCommand(absl::StrCat(Deltaserve(), " score --model ", model, " --tokens ", ids,
                                         " --prefill-chunk ", chunk, " --logits-out ", logits),
                            &output),
        0)
        << output;
    const std::string out = absl::StrCat(dir, "/lp_", chunk, ".safetensors");
    ASSERT_EQ(testing::RunCommand(
                  absl::StrCat(Deltaserve(), " score --model ", model, " --tokens ", ids,
                               " --prefill-chunk ", chunk, " --top-k 5", " --logprobs-out ", out),
                  &output),
              0)
        << output;
    std::vector<int64_t> shape;
    Read(out, "logprobs", &shape);
    EXPECT_EQ(shape, std::vector<int64_t>{149});
    Read(out, "top_ids", &shape);
    EXPECT_EQ(shape, (std::vector<int64_t>{149, 5}));
    SCOPED_TRACE(absl::StrCat("--prefill-chunk ", chunk));
    ExpectLogprobsMatchLogits(out, logits, 149, 5, 1e-5);
  }
}

// --window N scores the document as independent windows of N tokens: its
// log-probs are those of each window scored alone, in turn, one fewer than
// the window's tokens each (the last window is shorter).
TEST(ScoreCliTest, WindowsAreScoredAsIndependentDocuments) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("score_window");
  const std::vector<int32_t> tokens = testing::RandomTokens(150, 5);
  std::string output;
  const std::string windowed = dir + "/windowed.safetensors";
  ASSERT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " score --model ", model, " --tokens ",
                                             absl::StrJoin(tokens, ","),
                                             " --window 64 --top-k 2 --logprobs-out ", windowed),
                                &output),
            0)
      << output;
  std::vector<int64_t> shape;
  const std::vector<double> got = Read(windowed, "logprobs", &shape);
  EXPECT_EQ(shape, std::vector<int64_t>{150 - 3});
  Read(windowed, "top_ids", &shape);
  EXPECT_EQ(shape, (std::vector<int64_t>{150 - 3, 2}));
  std::vector<double> want;
  for (size_t begin = 0; begin < tokens.size(); begin += 64) {
    const std::vector<int32_t> window(tokens.begin() + begin,
                                      tokens.begin() + std::min(tokens.size(), begin + 64));
    const std::string alone = absl::StrCat(dir, "/alone_", begin, ".safetensors");
    ASSERT_EQ(
        testing::RunCommand(absl::StrCat(Deltaserve(), " score --model ", model, " --tokens ",
                                         absl::StrJoin(window, ","), " --logprobs-out ", alone),
                            &output),
        0)
        << output;
    const std::vector<double> part = Read(alone, "logprobs");
    want.insert(want.end(), part.begin(), part.end());
  }
  // Scored together, the windows share steps, so the GEMMs block their rows
  // otherwise than alone: float32 rounding, which k3-tiny's random weights
  // amplify (docs/numerics.md), measured up to 6.2e-5 on an Intel Xeon and
  // 6.3e-4 on an AMD EPYC (Zen 4), whose kernels block differently. A window
  // that read the one before's state would be off by far more: scoring the
  // second window after the first moved its log-probs by 0.21 at the median
  // and up to 2.0.
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-3) << "position " << i;

  for (const char* bad : {"--window -1 --logprobs-out", "--window 8 --logits-out",
                          "--window 8 --decode-from 4 --logprobs-out"}) {
    EXPECT_NE(testing::RunCommand(absl::StrCat(Deltaserve(), " score --model ", model,
                                               " --tokens 1,2,3 ", bad, " ", dir, "/bad"),
                                  &output),
              0)
        << bad;
    EXPECT_NE(output.find("--window"), std::string::npos) << output;
  }
}

TEST(ScoreCliTest, LogitsOutRefusesWhatDoesNotFitNamingTheSize) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("score_refuse");
  std::string output;
  EXPECT_NE(testing::RunCommand(absl::StrCat(Deltaserve(), " score --model ", model,
                                             " --tokens 1,2,3,4,5,6,7,8,9,10 --max-logits-bytes "
                                             "10239 --logits-out ",
                                             dir, "/x.safetensors"),
                                &output),
            0);
  EXPECT_NE(output.find("would hold 10240 bytes of logits (T x vocab = 10 x 256 float32)"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("--max-logits-bytes 10239"), std::string::npos) << output;
  EXPECT_NE(output.find("--logprobs-out"), std::string::npos) << output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.safetensors"));
  // At the limit it runs.
  EXPECT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " score --model ", model,
                                             " --tokens 1,2,3,4,5,6,7,8,9,10 --max-logits-bytes "
                                             "10240 --logits-out ",
                                             dir, "/x.safetensors"),
                                &output),
            0)
      << output;
}

// --logits-out and --logprobs-out write a new name or replace a regular file,
// and refuse, before the model runs and leaving it as it was, a symbolic link
// (the file it points to untouched), a FIFO, a device node, or a link planted
// at the temporary name the file is written under.
TEST(ScoreCliTest, OutputsAreNewNamesOrRegularFilesNeverLinksFifosOrDevices) {
  const std::string model = testing::GoldenPath("model/k3-tiny");
  const std::string dir = testing::TempDir("score_output_kind");
  const std::string victim = dir + "/victim";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, dir + "/link.safetensors");
  ASSERT_EQ(::mkfifo((dir + "/fifo.safetensors").c_str(), 0600), 0);
  // A device node of our own (/dev/full's numbers), not the system's.
  const bool have_device =
      ::mknod((dir + "/full.safetensors").c_str(), S_IFCHR | 0600, makedev(1, 7)) == 0;
  std::filesystem::create_symlink(victim, dir + "/planted.safetensors.tmp");
  auto score = [&](const std::string& flag, const std::string& path, std::string* output) {
    return testing::RunCommand(
        absl::StrCat(Deltaserve(), " score --model ", model, " --tokens 1,2,3,4 ", flag, " ", path),
        output);
  };
  std::string output;
  for (const char* flag : {"--logits-out", "--logprobs-out"}) {
    for (const auto& [name, what] : std::vector<std::pair<std::string, std::string>>{
             {"link.safetensors", ": is a symbolic link, not a regular file"},
             {"fifo.safetensors", ": is a FIFO, not a regular file"},
             {"full.safetensors", ": is a character device, not a regular file"},
             {"planted.safetensors", ".tmp: is a symbolic link, not a regular file"},
         }) {
      if (name == "full.safetensors" && !have_device) continue;
      SCOPED_TRACE(absl::StrCat(flag, " ", name));
      EXPECT_NE(score(flag, dir + "/" + name, &output), 0) << output;
      EXPECT_NE(output.find(dir + "/" + name + what), std::string::npos) << output;
    }
  }
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
            "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.safetensors"));
  EXPECT_TRUE(std::filesystem::is_fifo(dir + "/fifo.safetensors"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/planted.safetensors.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/planted.safetensors"));
  if (have_device) {
    EXPECT_TRUE(std::filesystem::is_character_file(dir + "/full.safetensors"));
  }
  // A regular file is replaced, a new name written.
  ASSERT_EQ(score("--logits-out", victim, &output), 0) << output;
  EXPECT_EQ(testing::ReadGoldenFile(victim)->Get("logits").shape, (std::vector<int64_t>{4, 256}));
  ASSERT_EQ(score("--logprobs-out", dir + "/new.safetensors", &output), 0) << output;
  EXPECT_TRUE(std::filesystem::is_regular_file(dir + "/new.safetensors"));
}

// A K3-shaped model (K3 gate, attention residuals) of KDA layers and dense
// FFNs only: linear in the document's length, so 1M tokens take a minute here;
// MLA's prefill over 1M tokens is quadratic and its attention holds a tile of
// scores, never a chunk's (tests/runtime/model/long_context_test.cc runs it
// at 256k). vocab 512: [1M, vocab] float32 is 2 GiB, what must not be held.
ModelConfig MillionConfig() {
  ModelConfig c = testing::SmallestK3({LayerKind::kKda, LayerKind::kKda}, 512);
  c.first_k_dense_replace = 2;  // no MoE layer: what is measured is the logits
  return c;
}

// The largest peak resident memory of any child this process has waited for.
int64_t ChildrenPeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

TEST(ScoreCliTest, MillionTokenDocumentHoldsOnePieceOfLogitsAtATime) {
  const std::string dir = testing::TempDir("score_million");
  std::ofstream(dir + "/config.json") << ModelConfigToJson(MillionConfig());
  std::string output;
  ASSERT_EQ(testing::RunCommand(absl::StrCat(Deltaserve(), " make-model --config ", dir,
                                             "/config.json --out ", dir, "/model"),
                                &output),
            0)
      << output;
  const int64_t T = 1048576, vocab = 512;
  const std::vector<int32_t> tokens = testing::RandomTokens(T, 12, vocab);
  std::ofstream(dir + "/doc.txt") << absl::StrJoin(tokens, " ");
  std::ofstream(dir + "/head.txt")
      << absl::StrJoin(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3000), " ");

  // [T, vocab] is 2 GiB: --logits-out refuses it under the default limit.
  EXPECT_NE(testing::RunCommand(
                absl::StrCat(Deltaserve(), " score --model ", dir, "/model --tokens-file ", dir,
                             "/doc.txt --logits-out ", dir, "/all.safetensors"),
                &output),
            0);
  EXPECT_NE(output.find("would hold 2147483648 bytes of logits (T x vocab = 1048576 x 512"),
            std::string::npos)
      << output;

  const int64_t rss_before = ChildrenPeakRssBytes();
  ASSERT_EQ(testing::RunCommand(
                absl::StrCat(Deltaserve(), " score --model ", dir, "/model --tokens-file ", dir,
                             "/doc.txt --top-k 2 --stats --logprobs-out ", dir, "/lp.safetensors"),
                &output),
            0)
      << output;
  const int64_t rss_peak = ChildrenPeakRssBytes();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, std::regex("largest logits buffer (\\d+) bytes")))
      << output;
  const int64_t peak_logits = std::stoll(m[1]);
  // Pieces of 4 MiB of logits (2048 rows of 512): never more, and never the
  // whole document's 2 GiB.
  EXPECT_GT(peak_logits, 0);
  EXPECT_LE(peak_logits, int64_t{4} << 20) << output;
  // The process's peak memory: the model, the document's tokens (held by the
  // file text, the prompt, the scheduler and the output: tens of MB) and one
  // piece; measured 93 MB, and [T, vocab] alone would be 2 GiB.
  EXPECT_LE(rss_peak, int64_t{200} << 20)
      << "peak RSS " << rss_peak << " (before " << rss_before << ")\n"
      << output;
  std::printf("1M-token score: largest logits buffer %lld bytes, peak RSS %lld MB\n%s",
              static_cast<long long>(peak_logits), static_cast<long long>(rss_peak >> 20),
              output.c_str());

  std::vector<int64_t> shape;
  const std::vector<double> lp = Read(dir + "/lp.safetensors", "logprobs", &shape);
  ASSERT_EQ(shape, std::vector<int64_t>{T - 1});
  for (int64_t i = 0; i < T - 1; ++i) {
    ASSERT_TRUE(std::isfinite(lp[i]) && lp[i] <= 0.0) << "position " << i << ": " << lp[i];
  }
  // The document's start scored alone through --logits-out: the same values
  // (causal: a position sees only what came before it), up to the rounding
  // of a piece of 3000 rows against one of 8192 (docs/numerics.md,
  // invariance: 5e-5 relative on logits of a few units).
  ASSERT_EQ(testing::RunCommand(
                absl::StrCat(Deltaserve(), " score --model ", dir, "/model --tokens-file ", dir,
                             "/head.txt --logits-out ", dir, "/head.safetensors"),
                &output),
            0)
      << output;
  ExpectLogprobsMatchLogits(dir + "/lp.safetensors", dir + "/head.safetensors", 2999, 2, 2e-4);
}

}  // namespace
}  // namespace deltaserve
