#include "runtime/serving/request_validation.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace deltaserve {
namespace {

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Holds one of the limited tokenization slots while alive.
class Slot {
 public:
  explicit Slot(std::atomic<int64_t>& count) : count_(count) { held_ = ++count_; }
  ~Slot() { --count_; }
  int64_t held() const { return held_; }

 private:
  std::atomic<int64_t>& count_;
  int64_t held_;
};

}  // namespace

RequestValidator::RequestValidator(const ModelConfig& config, const Tokenizer* tokenizer,
                                   RequestLimits limits)
    : config_(config), tokenizer_(tokenizer), limits_(limits) {}

int64_t RequestValidator::max_text_bytes() const {
  int64_t by_context = 0;
  if (__builtin_mul_overflow(limits_.max_text_bytes_per_token, config_.max_position_embeddings,
                             &by_context)) {
    by_context = INT64_MAX;
  }
  return std::min(limits_.max_request_bytes, by_context);
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::Tokenize(const std::string& text,
                                                                const std::string& name) const {
  if (text.empty()) return Invalid(name, "empty");
  if (static_cast<int64_t>(text.size()) > limits_.max_request_bytes) {
    return Invalid(name, absl::StrCat(text.size(), " bytes, over the limit of ",
                                      limits_.max_request_bytes, " (--max-request-bytes)"));
  }
  if (static_cast<int64_t>(text.size()) > max_text_bytes()) {
    return Invalid(name,
                   absl::StrCat(text.size(), " bytes, over the limit of ", max_text_bytes(),
                                " (--max-text-bytes-per-token ", limits_.max_text_bytes_per_token,
                                " x the context of ", config_.max_position_embeddings, " tokens)"));
  }
  if (tokenizer_ == nullptr) {
    return Invalid(name, "this model has no tokenizer; send token ids instead");
  }
  const Slot slot(tokenizing_);
  if (slot.held() > limits_.max_concurrent_tokenizations) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": ", limits_.max_concurrent_tokenizations,
                     " texts are being tokenized, the limit (--max-concurrent-tokenizations); "
                     "try again, or send token ids"));
  }
  auto encoded = tokenizer_->Encode(text);
  if (!encoded.ok()) return Invalid(name, std::string(encoded.status().message()));
  return std::move(*encoded);
}

template <typename Req>
absl::StatusOr<std::vector<int32_t>> RequestValidator::InputTokens(const Req& req,
                                                                   const std::string& field) const {
  std::vector<int32_t> tokens;
  if (req.has_text()) {
    auto encoded = Tokenize(req.text(), field + ".text");
    if (!encoded.ok()) return encoded.status();
    tokens = std::move(*encoded);
  } else if (req.has_tokens()) {
    const auto& ids = req.tokens().ids();
    const std::string name = field + ".tokens";
    if (ids.empty()) return Invalid(name, "empty");
    if (static_cast<int64_t>(ids.size()) > limits_.max_request_bytes / 4) {
      return Invalid(
          name, absl::StrCat(ids.size(), " ids, over the limit of ", limits_.max_request_bytes / 4,
                             " (--max-request-bytes / 4)"));
    }
    for (int i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
        return Invalid(
            absl::StrCat(name, ".ids[", i, "]"),
            absl::StrCat(ids[i], " is outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
    tokens.assign(ids.begin(), ids.end());
  } else {
    return Invalid(field, "missing: give text or tokens");
  }
  if (tokens.empty()) return Invalid(field, "no tokens");
  if (static_cast<int64_t>(tokens.size()) > config_.max_position_embeddings) {
    return Invalid(field, absl::StrCat(tokens.size(), " tokens, longer than the context of ",
                                       config_.max_position_embeddings));
  }
  return tokens;
}

absl::StatusOr<GenerateParams> RequestValidator::Params(const v1::GenerateRequest& req) const {
  GenerateParams p;
  const v1::SamplingParams& s = req.sampling();
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return Invalid("sampling.temperature",
                   absl::StrCat(s.temperature(), ": must be a finite number >= 0"));
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat(s.top_k(), ": must be >= 0"));
  if (s.has_top_p() && !(s.top_p() > 0 && s.top_p() <= 1)) {
    return Invalid("sampling.top_p", absl::StrCat(s.top_p(), ": must be in (0, 1]"));
  }
  p.sampling.temperature = s.temperature();
  p.sampling.top_k = s.top_k();
  p.sampling.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  p.seed = s.seed();
  if (req.max_tokens() < 0) {
    return Invalid("max_tokens", absl::StrCat(req.max_tokens(), ": must be >= 0"));
  }
  p.max_tokens = req.max_tokens() == 0 ? kDefaultMaxTokens : req.max_tokens();
  if (req.stop_size() > kMaxStops) {
    return Invalid("stop",
                   absl::StrCat(req.stop_size(), " strings, over the limit of ", kMaxStops));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string& stop = req.stop(i);
    const std::string name = absl::StrCat("stop[", i, "]");
    if (stop.empty()) return Invalid(name, "empty");
    if (stop.size() > kMaxStopBytes) {
      return Invalid(name, absl::StrCat(stop.size(), " bytes, over the limit of ", kMaxStopBytes));
    }
    if (tokenizer_ == nullptr) {
      return Invalid(name, "this model has no tokenizer to match text against");
    }
    p.stop.push_back(stop);
  }
  if (req.stop_token_ids_size() > limits_.max_stop_token_ids) {
    return Invalid("stop_token_ids",
                   absl::StrCat(req.stop_token_ids_size(), " ids, over the limit of ",
                                limits_.max_stop_token_ids, " (--max-stop-token-ids)"));
  }
  for (int i = 0; i < req.stop_token_ids_size(); ++i) {
    const int32_t id = req.stop_token_ids(i);
    if (id < 0 || id >= config_.vocab_size) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "]"),
                     absl::StrCat(id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
    p.stop_ids.push_back(id);
  }
  if (req.top_logprobs() < 0 || req.top_logprobs() > kMaxTopLogprobs) {
    return Invalid("top_logprobs",
                   absl::StrCat(req.top_logprobs(), ": must be in [0, ", kMaxTopLogprobs, "]"));
  }
  p.logprobs = req.logprobs() || req.top_logprobs() > 0;
  p.top_logprobs = req.top_logprobs();
  p.ignore_eos = req.ignore_eos();
  return p;
}

absl::StatusOr<ValidGenerate> RequestValidator::Generate(const v1::GenerateRequest& req) const {
  // The parameters first: a request refused for them costs no tokenization.
  auto params = Params(req);
  if (!params.ok()) return params.status();
  auto prompt = InputTokens(req, "prompt");
  if (!prompt.ok()) return prompt.status();
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->size());
  if (prompt_tokens + params->max_tokens > config_.max_position_embeddings) {
    return Invalid("max_tokens",
                   absl::StrCat(prompt_tokens, " prompt tokens + ", params->max_tokens,
                                " exceed the context of ", config_.max_position_embeddings));
  }
  return ValidGenerate{std::move(*prompt), std::move(*params)};
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::Score(const v1::ScoreRequest& req) const {
  auto tokens = InputTokens(req, "input");
  if (!tokens.ok()) return tokens.status();
  if (tokens->size() < 2) return Invalid("input", "needs at least 2 tokens");
  return tokens;
}

absl::StatusOr<std::string> RequestValidator::RequestId(const std::string& given) const {
  if (given.size() > kMaxRequestIdBytes) {
    return Invalid("request_id",
                   absl::StrCat(given.size(), " bytes, over the limit of ", kMaxRequestIdBytes));
  }
  if (!given.empty()) return given;
  // 128 random bits, so that no client can guess, and Abort, another's.
  uint8_t bits[16];
  size_t got = 0;
  while (got < sizeof(bits)) {
    const ssize_t n = ::getrandom(bits + got, sizeof(bits) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError("getrandom failed: no request id could be made");
    got += static_cast<size_t>(n);
  }
  return absl::StrCat("req-", absl::BytesToHexString(absl::string_view(
                                  reinterpret_cast<const char*>(bits), sizeof(bits))));
}

}  // namespace deltaserve
