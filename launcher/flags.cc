#include "launcher/flags.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltaserve {

absl::StatusOr<Flags> Flags::Parse(const std::string& command, const std::vector<std::string>& args,
                                   const std::set<std::string>& valued,
                                   const std::set<std::string>& switches) {
  Flags flags;
  flags.command_ = command;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat(command, ": unexpected argument '", arg, "'"));
    }
    const std::string_view body = std::string_view(arg).substr(2);
    const size_t eq = body.find('=');
    const bool inline_value = eq != std::string_view::npos;
    const std::string name(body.substr(0, eq));
    std::string value = inline_value ? std::string(body.substr(eq + 1)) : "";
    if (switches.count(name)) {
      if (inline_value) {
        return absl::InvalidArgumentError(
            absl::StrCat(command, ": flag --", name, " takes no value"));
      }
      flags.values_[name] = "1";
      continue;
    }
    if (!valued.count(name)) {
      std::set<std::string> all = valued;
      all.insert(switches.begin(), switches.end());
      return absl::InvalidArgumentError(absl::StrCat(
          command, ": unknown flag --", name, " (known: --", absl::StrJoin(all, ", --"), ")"));
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(command, ": flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    flags.values_[name] = value;
  }
  return flags;
}

std::string Flags::GetString(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<std::string> Flags::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(command_, ": missing required flag --", name));
  }
  return it->second;
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(command_, ": --", name, " must be an integer, got '", it->second, "'"));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || errno != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(command_, ": --", name, " must be a number, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text,
                                                    const std::string& what) {
  std::vector<int32_t> tokens;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ',' || std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ',' &&
           !std::isspace(static_cast<unsigned char>(text[j]))) {
      ++j;
    }
    const std::string item = text.substr(i, j - i);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < std::numeric_limits<int32_t>::min() ||
        v > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", item, "' (item ", tokens.size(), ") is not a token id"));
    }
    tokens.push_back(static_cast<int32_t>(v));
    i = j;
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no token ids"));
  }
  return tokens;
}

}  // namespace deltaserve
