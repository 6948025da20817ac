#include "runtime/model/quantization.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "re2/re2.h"

namespace deltaserve {

struct QuantizationMatcher::Pattern {
  std::string text;                    // as written
  std::unique_ptr<const re2::RE2> re;  // "re:" entries; null for a name
};

namespace {

constexpr char kRegexPrefix[] = "re:";
// nn.Linear: compressed-tensors matches a target by class name as well as by
// module name, and every weight matrix of these models is a Linear.
constexpr char kLinearClass[] = "Linear";

std::unique_ptr<const re2::RE2> CompileRegex(const std::string& entry) {
  re2::RE2::Options options;
  options.set_log_errors(false);  // a hostile config is reported once, by us
  return std::make_unique<const re2::RE2>(entry.substr(sizeof(kRegexPrefix) - 1), options);
}

absl::StatusOr<std::vector<std::shared_ptr<const QuantizationMatcher::Pattern>>> Compile(
    const std::vector<std::string>& entries, const std::string& what) {
  std::vector<std::shared_ptr<const QuantizationMatcher::Pattern>> out;
  for (const std::string& entry : entries) {
    if (absl::Status s = CheckQuantizationEntry(entry); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
    }
    auto pattern = std::make_shared<QuantizationMatcher::Pattern>();
    pattern->text = entry;
    if (absl::StartsWith(entry, kRegexPrefix)) pattern->re = CompileRegex(entry);
    out.push_back(std::move(pattern));
  }
  return out;
}

bool Selects(const QuantizationMatcher::Pattern& pattern, const std::string& module) {
  if (pattern.re != nullptr) {
    // Python's re.match: anchored at the start only.
    return pattern.re->Match(module, 0, module.size(), re2::RE2::ANCHOR_START, nullptr, 0);
  }
  return pattern.text == module || pattern.text == kLinearClass;
}

}  // namespace

absl::Status CheckQuantizationEntry(const std::string& entry) {
  if (!absl::StartsWith(entry, kRegexPrefix)) return absl::OkStatus();
  const std::unique_ptr<const re2::RE2> re = CompileRegex(entry);
  if (re->ok()) return absl::OkStatus();
  // Entries come from a config.json: keep a hostile one (which RE2's message
  // quotes too) from flooding the message.
  auto shorten = [](const std::string& text) {
    return text.size() > 80 ? text.substr(0, 77) + "..." : text;
  };
  return absl::InvalidArgumentError(absl::StrCat("'", shorten(entry),
                                                 "' is not a regular expression the runtime "
                                                 "can match (",
                                                 shorten(re->error()), ")"));
}

QuantizationConfig RoutedExpertsMxfp4() {
  QuantizationConfig q;
  q.mxfp4 = true;
  q.targets = {R"(re:.*block_sparse_moe\.experts\.\d+\.w[123]$)"};
  q.ignore = {"lm_head",         "re:.*self_attn.*",     "re:.*shared_experts.*",
              R"(re:.*mlp\..*)", "re:.*routed_expert.*", "re:.*gate$"};
  return q;
}

absl::StatusOr<QuantizationMatcher> QuantizationMatcher::Create(const QuantizationConfig& config) {
  QuantizationMatcher m;
  m.mxfp4_ = config.mxfp4;
  if (!config.mxfp4) return m;
  const std::string key = config.key.empty() ? "quantization_config" : config.key;
  auto targets = Compile(config.targets, "a target of " + key);
  if (!targets.ok()) return targets.status();
  auto ignore = Compile(config.ignore, key + ".ignore");
  if (!ignore.ok()) return ignore.status();
  m.targets_ = *std::move(targets);
  m.ignore_ = *std::move(ignore);
  return m;
}

QuantizationMatcher::Match QuantizationMatcher::Of(const std::string& module) const {
  Match match;
  if (!mxfp4_) return match;
  match.verdict = Verdict::kUntargeted;
  for (const auto& target : targets_) {
    if (Selects(*target, module)) {
      match.verdict = Verdict::kMxfp4;
      break;
    }
  }
  if (match.verdict != Verdict::kMxfp4) return match;
  for (const auto& entry : ignore_) {
    if (Selects(*entry, module)) {
      match.verdict = Verdict::kIgnored;
      match.ignored_by = entry->text;
      break;
    }
  }
  return match;
}

}  // namespace deltaserve
