#include "tests/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"

namespace deltaserve::testing {

std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::vector<float> out(n);
  for (float& x : out) {
    // Bits to [0,1) by hand: std distributions differ between libraries.
    const double u = static_cast<double>(gen() >> 11) * 0x1.0p-53;
    x = static_cast<float>(lo + (hi - lo) * u);
  }
  return out;
}

std::vector<int32_t> RandomTokens(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> tokens(n);
  uint64_t x = seed;
  for (auto& t : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return tokens;
}

std::vector<double> ToDouble(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

std::vector<float> ToFloat(const std::vector<double>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

std::vector<float> NaNs(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

template <typename A>
static double RelL2Impl(const std::vector<A>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    num += d * d;
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

double RelL2(const std::vector<float>& a, const std::vector<double>& b) { return RelL2Impl(a, b); }
double RelL2(const std::vector<double>& a, const std::vector<double>& b) { return RelL2Impl(a, b); }

::testing::AssertionResult AllClose(const std::vector<float>& a, const std::vector<double>& b,
                                    double atol, double rtol) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "size " << a.size() << " != " << b.size();
  }
  int failures = 0;
  std::ostringstream msg;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(diff <= atol + rtol * std::abs(b[i]))) {
      if (failures < 5) {
        msg << "\n  [" << i << "] got " << a[i] << " want " << b[i] << " (diff " << diff << ")";
      }
      ++failures;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << a.size() << " elements differ (atol " << atol << ", rtol " << rtol
         << "):" << msg.str();
}

double ReductionTolerance(int64_t n, double factor) {
  const double u = std::numeric_limits<float>::epsilon() / 2;
  return factor * u * std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)));
}

::testing::AssertionResult SameValues(const std::vector<float>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << a.size() << " values vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    if (!both_nan && static_cast<double>(a[i]) != b[i]) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> LogSoftmax(const float* logits, int64_t vocab) {
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  const double log_z = max + std::log(sum);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[i] = logits[i] - log_z;
  return out;
}

std::string SourcePath(const std::string& relative) {
  // DELTASERVE_SOURCE_DIR in the environment: a test binary carried to
  // another machine (deploy/gpu_check.sh) finds the checkout it runs in.
  const char* moved = std::getenv("DELTASERVE_SOURCE_DIR");
  const std::string root = moved != nullptr && moved[0] != '\0' ? moved : DELTASERVE_SOURCE_DIR;
  return root + "/" + relative;
}

std::string GoldenPath(const std::string& relative) {
  return SourcePath("../shared/golden/" + relative);
}

const GoldenTensor& GoldenFile::Get(const std::string& name) const {
  static const GoldenTensor kEmpty;
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    ADD_FAILURE() << "golden file has no tensor " << name;
    return kEmpty;
  }
  return it->second;
}

namespace {

// Little-endian element `i` of a tensor of `dtype` as double; false for a
// dtype the golden files do not use.
bool ReadElement(const std::string& dtype, const char* data, size_t i, double* out) {
  auto load = [&](auto value) {
    std::memcpy(&value, data + i * sizeof(value), sizeof(value));
    *out = static_cast<double>(value);
    return true;
  };
  if (dtype == "F64") return load(double{});
  if (dtype == "F32") return load(float{});
  if (dtype == "I64") return load(int64_t{});
  if (dtype == "I32") return load(int32_t{});
  return false;
}

size_t DtypeBytes(const std::string& dtype) {
  return dtype == "F64" || dtype == "I64" ? 8 : dtype == "F32" || dtype == "I32" ? 4 : 0;
}

}  // namespace

std::optional<GoldenFile> ReadGoldenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string file = bytes.str();
  uint64_t header_size = 0;
  if (!in || file.size() < 8) {
    ADD_FAILURE() << path << ": cannot read";
    return std::nullopt;
  }
  std::memcpy(&header_size, file.data(), 8);  // little-endian, as on x86
  if (header_size > file.size() - 8) {
    ADD_FAILURE() << path << ": header of " << header_size << " bytes runs past the file";
    return std::nullopt;
  }
  const nlohmann::json header =
      nlohmann::json::parse(file.substr(8, header_size), nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) {
    ADD_FAILURE() << path << ": header is not a JSON object";
    return std::nullopt;
  }
  const char* data = file.data() + 8 + header_size;
  const size_t data_size = file.size() - 8 - header_size;
  GoldenFile golden;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [key, value] : entry.items()) {
        if (value.is_string()) golden.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string dtype = entry.value("dtype", "");
    GoldenTensor tensor;
    tensor.shape = entry.value("shape", std::vector<int64_t>{});
    const auto offsets = entry.value("data_offsets", std::vector<size_t>{});
    size_t count = 1;
    for (int64_t d : tensor.shape) count *= static_cast<size_t>(d);
    if (DtypeBytes(dtype) == 0 || offsets.size() != 2 || offsets[0] > offsets[1] ||
        offsets[1] > data_size || offsets[1] - offsets[0] != count * DtypeBytes(dtype)) {
      ADD_FAILURE() << path << ": tensor " << name << " (" << dtype
                    << ") has an unsupported dtype or wrong data offsets";
      return std::nullopt;
    }
    tensor.values.resize(count);
    for (size_t i = 0; i < count; ++i) ReadElement(dtype, data + offsets[0], i, &tensor.values[i]);
    golden.tensors.emplace(name, std::move(tensor));
  }
  return golden;
}

std::string ModelPath(const std::string& model) {
  for (const std::string& trained : kTrainedModels) {
    if (model == trained) return SourcePath("models/" + model);
  }
  return GoldenPath("model/" + model);
}

GoldenLogits LoadGoldenLogits(const std::string& model) {
  GoldenLogits golden;
  auto file = ReadGoldenFile(ModelPath(model) + "/expected_logits.safetensors");
  if (!file) return golden;
  for (double t : file->Get("tokens").values) golden.tokens.push_back(static_cast<int64_t>(t));
  golden.logits = file->Get("logits").values;
  return golden;
}

std::string GoldenTestName(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::string BinPath(const std::string& name) {
  return std::string(DELTASERVE_BIN_DIR) + "/" + name;
}

std::string TempDir(const std::string& tag) {
  namespace fs = std::filesystem;
  // Removes every directory handed out when the test program exits.
  struct Registry {
    std::vector<fs::path> dirs;
    ~Registry() {
      std::error_code ec;
      for (const fs::path& d : dirs) fs::remove_all(d, ec);
    }
  };
  static Registry registry;
  std::random_device rd;
  fs::path dir = fs::temp_directory_path() / ("deltaserve_" + tag + "_" + std::to_string(rd()));
  fs::create_directories(dir);
  registry.dirs.push_back(dir);
  return dir.string();
}

int RunCommand(const std::string& command, std::string* output) {
  output->clear();
  // Grouped so redirections inside `command` apply before the merge.
  FILE* pipe = popen(("{ " + command + "\n} 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::unique_ptr<ChildProcess> ChildProcess::Start(const std::string& command,
                                                  const std::string& log_path) {
  const pid_t pid = fork();
  if (pid < 0) return nullptr;
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a signal sent at once reaches the group
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() {
  if (exit_code_) return;
  Signal(SIGTERM);
  if (!Wait(std::chrono::seconds(10))) {
    Signal(SIGKILL);
    Wait(std::chrono::seconds(10));
  }
}

void ChildProcess::Signal(int signal) { kill(-pid_, signal); }

std::optional<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return exit_code_;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      // Whatever the group started is not left behind.
      kill(-pid_, SIGKILL);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace deltaserve::testing
