// A small command-line flag parser for the subcommands: `--name value` or
// `--name=value`, switches without a value, and a clear error for unknown or
// malformed flags.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deltaserve {

class Flags {
 public:
  // `valued` flags take a value; `switches` take none. Names without "--".
  static absl::StatusOr<Flags> Parse(const std::string& command,
                                     const std::vector<std::string>& args,
                                     const std::set<std::string>& valued,
                                     const std::set<std::string>& switches = {});

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
};

// "1,2,3" (commas and/or whitespace) to token ids; `what` names the source.
absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text,
                                                    const std::string& what);

}  // namespace deltaserve
