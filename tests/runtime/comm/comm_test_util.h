// Helpers for the communication tests: a substring assertion for Status
// messages, and ScopedEnv, which sets or clears environment variables for one
// test and restores them after (for code that reads the launcher's
// environment).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace deltaserve::testing {

// EXPECT_TRUE(HasText(status.message(), "rank 4")) reports the whole text.
inline ::testing::AssertionResult HasText(absl::string_view text, absl::string_view part) {
  if (text.find(part) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not in \"" << text << "\"";
}
inline ::testing::AssertionResult HasText(const absl::Status& status, absl::string_view part) {
  if (status.ok())
    return ::testing::AssertionFailure() << "expected an error with \"" << part << "\", got OK";
  return HasText(status.message(), part);
}

class ScopedEnv {
 public:
  // Every variable the launcher checks reads, cleared: a clean slate even when
  // the tests themselves run under mpirun or srun.
  static ScopedEnv CleanLauncherEnv() {
    ScopedEnv env;
    for (const char* name :
         {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_STEP_ID",
          "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}) {
      env.Unset(name);
    }
    return env;
  }

  ScopedEnv() = default;
  ScopedEnv(ScopedEnv&& other) noexcept : saved_(std::move(other.saved_)) { other.saved_.clear(); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    // Restore in reverse, so a variable changed twice gets its first value.
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second.has_value()) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }

  void Set(const std::string& name, const std::string& value) {
    Save(name);
    setenv(name.c_str(), value.c_str(), 1);
  }
  void Unset(const std::string& name) {
    Save(name);
    unsetenv(name.c_str());
  }

 private:
  void Save(const std::string& name) {
    const char* value = std::getenv(name.c_str());
    saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
  }

  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace deltaserve::testing
