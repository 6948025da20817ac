// Shared helpers for the tests: random inputs, float64 comparisons with
// tolerances, NaN poisoning of outputs, the golden files, child processes.
// On no deltaserve library, so that a kernel test links only the kernels.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deltaserve::testing {

// Uniform values in [lo, hi), reproducible from the seed.
std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<double> ToDouble(const std::vector<float>& x);
std::vector<float> ToFloat(const std::vector<double>& x);

// n token ids in [0, vocab), reproducible from the seed.
std::vector<int32_t> RandomTokens(int64_t n, uint64_t seed, int64_t vocab = 256);

// Filled with quiet NaN: an element a kernel fails to write stays NaN and
// fails every comparison.
std::vector<float> NaNs(size_t n);

// ||a - b|| / ||b||, over all elements; NaN anywhere gives +inf.
double RelL2(const std::vector<float>& a, const std::vector<double>& b);
double RelL2(const std::vector<double>& a, const std::vector<double>& b);

// Elementwise |a - b| <= atol + rtol * |b|; reports the first failures.
::testing::AssertionResult AllClose(const std::vector<float>& a, const std::vector<double>& b,
                                    double atol, double rtol);

// Elementwise a == b exactly, NaN where b is NaN: for results that are copies
// or one correctly rounded step of the reference's; reports the first miss.
::testing::AssertionResult SameValues(const std::vector<float>& a, const std::vector<double>& b);

// Tolerance for a float32 result of a reduction over `n` terms of magnitude
// about 1: unit roundoff times sqrt(n) for the accumulation, times a safety
// factor for the few sequential operations around it.
double ReductionTolerance(int64_t n, double factor = 8.0);

// The log softmax of one row of logits, in double (what scores are checked
// against): logits - (max + log Σ exp(logits - max)).
std::vector<double> LogSoftmax(const float* logits, int64_t vocab);

// `<relative>` in the checkout: the build's, or the one $DELTASERVE_SOURCE_DIR
// names.
std::string SourcePath(const std::string& relative);

// `../shared/golden/<relative>` beside the checkout.
std::string GoldenPath(const std::string& relative);

// A golden safetensors file read whole, every tensor as float64 (F64, F32,
// I64 and I32, which is what the golden files hold). The tests read their
// oracles with this, not with the model library's reader: kernel tests do not
// link that library, and a reader bug cannot hide in both sides of a check.
struct GoldenTensor {
  std::vector<int64_t> shape;
  std::vector<double> values;  // row-major
};
struct GoldenFile {
  std::map<std::string, GoldenTensor> tensors;
  std::map<std::string, std::string> metadata;
  // The named tensor; fails the current test (and gives an empty one) when
  // there is none.
  const GoldenTensor& Get(const std::string& name) const;
};
// Fails the current test and returns nullopt when the file cannot be read.
std::optional<GoldenFile> ReadGoldenFile(const std::string& path);

// The directory of a test model: models/<model> in the checkout for the
// trained models (kTrainedModels), else ../shared/golden/model/<model>.
std::string ModelPath(const std::string& model);

// <ModelPath(model)>/expected_logits.safetensors: the prompt and its float64
// logits [T, vocab]. Fails the current test when unreadable.
struct GoldenLogits {
  std::vector<int64_t> tokens;
  std::vector<double> logits;
};
GoldenLogits LoadGoldenLogits(const std::string& model);

// The golden models, and their names as gtest parameter names.
inline const std::string kGoldenModels[] = {"k3-tiny", "kimi-linear-tiny"};
// The same shapes (other random weights and prompt) with rms_norm_eps 1e-3
// instead of 1e-5. Above, rms_norm_eps equals the 1e-5 a norm might wrongly
// hard-code and is near the fixed 1e-6 of others, so a norm taking the wrong
// epsilon may not show; here it moves the logits far past the golden bound
// (docs/numerics.md). The tests that compare with the golden logits run these
// too; the engine tests, whose code paths no epsilon changes, do not.
inline const std::string kEpsGoldenModels[] = {"k3-tiny-eps", "kimi-linear-tiny-eps"};
// K3 with its routed experts in MXFP4, as the published checkpoint stores
// them; its golden logits come from the dequantised weights in float64.
inline const std::string kMxfp4GoldenModels[] = {"k3-tiny-mxfp4"};
// The trained demonstration model committed under models/ and its MXFP4
// export; their expected logits come from the PyTorch reference
// (tools/reference) in float64 on a held-out passage.
inline const std::string kTrainedModels[] = {"k3-mini-kjv", "k3-mini-kjv-mxfp4"};
std::string GoldenTestName(const ::testing::TestParamInfo<std::string>& info);

// Path of a built executable (build/bin/<name>).
std::string BinPath(const std::string& name);

// A fresh empty directory under the system temp dir, removed at exit.
std::string TempDir(const std::string& tag);

// Runs a shell command, returns its exit status; stdout+stderr in *output.
int RunCommand(const std::string& command, std::string* output);

// A program started in the background, in its own process group so that a
// signal reaches everything it started (mpirun and its ranks). Its stdout and
// stderr go to `log_path`. The destructor stops it: SIGTERM, then SIGKILL.
class ChildProcess {
 public:
  static std::unique_ptr<ChildProcess> Start(const std::string& command,
                                             const std::string& log_path);
  ~ChildProcess();
  void Signal(int signal);  // to the whole group
  // The exit code once it has ended within `timeout` (128 + signal when
  // killed); nullopt while it runs.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  std::string Log() const;
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  std::optional<int> exit_code_;
};

// /usr/bin/python3: Debian's, which has python3-grpcio (not a pyenv one).
inline constexpr char kSystemPython[] = "/usr/bin/python3";

}  // namespace deltaserve::testing
