#include "runtime/serving/request_validation.h"

#include <algorithm>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/random_bytes.h"

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
                                   RequestLimits limits, const ChatFormat* chat)
    : config_(config), tokenizer_(tokenizer), limits_(limits), chat_(chat) {}

int64_t RequestValidator::max_text_bytes() const {
  int64_t by_context = 0;
  if (__builtin_mul_overflow(limits_.max_text_bytes_per_token, config_.max_position_embeddings,
                             &by_context)) {
    by_context = INT64_MAX;
  }
  return std::min(limits_.max_request_bytes, by_context);
}

absl::Status RequestValidator::CheckTextBytes(int64_t bytes, const std::string& name) const {
  if (bytes > limits_.max_request_bytes) {
    return Invalid(name, absl::StrCat(bytes, " bytes, over the limit of ",
                                      limits_.max_request_bytes, " (--max-request-bytes)"));
  }
  if (bytes > max_text_bytes()) {
    return Invalid(name,
                   absl::StrCat(bytes, " bytes, over the limit of ", max_text_bytes(),
                                " (--max-text-bytes-per-token ", limits_.max_text_bytes_per_token,
                                " x the context of ", config_.max_position_embeddings, " tokens)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::Tokenize(const std::string& text,
                                                                const std::string& name) const {
  if (text.empty()) return Invalid(name, "empty");
  if (absl::Status ok = CheckTextBytes(static_cast<int64_t>(text.size()), name); !ok.ok()) {
    return ok;
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

absl::StatusOr<std::vector<int32_t>> RequestValidator::Tokens(const PromptInput& input,
                                                              const std::string& field) const {
  std::vector<int32_t> tokens;
  switch (input.form) {
    case PromptInput::Form::kText: {
      auto encoded = Tokenize(input.text, field);
      if (!encoded.ok()) return encoded.status();
      tokens = std::move(*encoded);
      break;
    }
    case PromptInput::Form::kIds: {
      const std::vector<int64_t>& ids = input.ids;
      if (ids.empty()) return Invalid(field, "empty");
      if (static_cast<int64_t>(ids.size()) > limits_.max_request_bytes / 4) {
        return Invalid(field,
                       absl::StrCat(ids.size(), " ids, over the limit of ",
                                    limits_.max_request_bytes / 4, " (--max-request-bytes / 4)"));
      }
      tokens.reserve(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
          return Invalid(
              absl::StrCat(field, "[", i, "]"),
              absl::StrCat(ids[i], " is outside the vocabulary [0, ", config_.vocab_size, ")"));
        }
        tokens.push_back(static_cast<int32_t>(ids[i]));
      }
      break;
    }
    case PromptInput::Form::kChat: {
      auto rendered = RenderChat(input.chat);
      if (!rendered.ok()) return rendered.status();
      tokens = std::move(*rendered);
      break;
    }
    case PromptInput::Form::kNone:
      return Invalid(field, "missing: give text or token ids");
  }
  if (tokens.empty()) return Invalid(field, "no tokens");
  if (static_cast<int64_t>(tokens.size()) > config_.max_position_embeddings) {
    return Invalid(field, absl::StrCat(tokens.size(), " tokens, longer than the context of ",
                                       config_.max_position_embeddings));
  }
  if (limits_.max_prompt_tokens > 0 &&
      static_cast<int64_t>(tokens.size()) > limits_.max_prompt_tokens) {
    return Invalid(
        field, absl::StrCat(
                   tokens.size(), " tokens",
                   input.form == PromptInput::Form::kChat ? " as the chat template renders it" : "",
                   ", over the limit of ", limits_.max_prompt_tokens, " (--max-prompt-tokens)"));
  }
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::RenderChat(const ChatRequest& chat) const {
  if (chat_ == nullptr || tokenizer_ == nullptr) {
    return Invalid("messages",
                   "this model has no chat format: its directory's tokenizer files "
                   "(tokenizer_config.json) name neither Kimi K3's nor Kimi Linear's chat tokens; "
                   "send a prompt instead");
  }
  if (chat.messages.empty()) return Invalid("messages", "empty");
  if (static_cast<int64_t>(chat.messages.size()) > kMaxChatMessages) {
    return Invalid("messages", absl::StrCat(chat.messages.size(), " messages, over the limit of ",
                                            kMaxChatMessages));
  }
  auto segments = chat_->Render(chat);
  if (!segments.ok()) return segments.status();
  int64_t bytes = 0;
  for (const ChatSegment& s : *segments) bytes += static_cast<int64_t>(s.text.size());
  if (absl::Status ok = CheckTextBytes(bytes, "messages"); !ok.ok()) return ok;
  const Slot slot(tokenizing_);
  if (slot.held() > limits_.max_concurrent_tokenizations) {
    return absl::ResourceExhaustedError(
        absl::StrCat("messages: ", limits_.max_concurrent_tokenizations,
                     " texts are being tokenized, the limit (--max-concurrent-tokenizations); "
                     "try again"));
  }
  auto ids = EncodeChat(*segments, *tokenizer_);
  if (!ids.ok()) return Invalid("messages", std::string(ids.status().message()));
  return std::move(*ids);
}

absl::StatusOr<GenerateParams> RequestValidator::Params(const GenerateInput& req) const {
  GenerateParams p;
  // Checked as the float32 the engine takes: 1e300 would be infinity there.
  if (!(req.temperature >= 0 && req.temperature <= std::numeric_limits<float>::max())) {
    return Invalid("temperature", absl::StrCat(req.temperature, ": must be a finite number >= 0"));
  }
  if (req.top_k < 0 || req.top_k > std::numeric_limits<int32_t>::max()) {
    return Invalid("top_k", absl::StrCat(req.top_k, ": must be in [0, ",
                                         std::numeric_limits<int32_t>::max(), "]"));
  }
  float top_p = 1.0f;
  if (req.top_p.has_value()) {
    // 1e-50 is 0 as a float32; a value outside (0, 1] is not converted.
    top_p = *req.top_p > 0 && *req.top_p <= 1 ? static_cast<float>(*req.top_p) : 0.0f;
    if (!(top_p > 0 && top_p <= 1)) {
      return Invalid("top_p", absl::StrCat(*req.top_p, ": must be in (0, 1]"));
    }
  }
  p.sampling.temperature = static_cast<float>(req.temperature);
  p.sampling.top_k = req.top_k;
  p.sampling.top_p = top_p;
  p.seed = req.seed;
  if (req.max_tokens < 0) {
    return Invalid("max_tokens", absl::StrCat(req.max_tokens, ": must be >= 0"));
  }
  if (req.max_tokens > config_.max_position_embeddings) {
    return Invalid("max_tokens", absl::StrCat(req.max_tokens, " exceeds the context of ",
                                              config_.max_position_embeddings));
  }
  p.max_tokens = req.max_tokens == 0 ? kDefaultMaxTokens : req.max_tokens;
  if (req.stop.size() > static_cast<size_t>(kMaxStops)) {
    return Invalid("stop",
                   absl::StrCat(req.stop.size(), " strings, over the limit of ", kMaxStops));
  }
  for (size_t i = 0; i < req.stop.size(); ++i) {
    const std::string& stop = req.stop[i];
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
  if (static_cast<int64_t>(req.stop_token_ids.size()) > limits_.max_stop_token_ids) {
    return Invalid("stop_token_ids",
                   absl::StrCat(req.stop_token_ids.size(), " ids, over the limit of ",
                                limits_.max_stop_token_ids, " (--max-stop-token-ids)"));
  }
  for (size_t i = 0; i < req.stop_token_ids.size(); ++i) {
    const int64_t id = req.stop_token_ids[i];
    if (id < 0 || id >= config_.vocab_size) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "]"),
                     absl::StrCat(id, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
    p.stop_ids.push_back(static_cast<int32_t>(id));
  }
  if (req.top_logprobs < 0 || req.top_logprobs > kMaxTopLogprobs) {
    return Invalid("top_logprobs",
                   absl::StrCat(req.top_logprobs, ": must be in [0, ", kMaxTopLogprobs, "]"));
  }
  p.logprobs = req.logprobs || req.top_logprobs > 0;
  p.top_logprobs = static_cast<int32_t>(req.top_logprobs);
  p.ignore_eos = req.ignore_eos;
  return p;
}

absl::StatusOr<ValidGenerate> RequestValidator::Generate(const GenerateInput& req,
                                                         const std::string& prompt_field) const {
  // The parameters first: a request refused for them costs no tokenization.
  auto params = Params(req);
  if (!params.ok()) return params.status();
  auto prompt = Tokens(req.prompt, prompt_field);
  if (!prompt.ok()) return prompt.status();
  if (req.prompt.form == PromptInput::Form::kChat && !req.ignore_eos) {
    // The tokens that end an assistant turn end the reply, whatever the
    // tokenizer's own end tokens are.
    for (const std::string& token : chat_->end_tokens()) {
      auto id = tokenizer_->Encode(token, /*allow_special=*/true);
      if (id.ok() && id->size() == 1) params->stop_ids.push_back((*id)[0]);
    }
  }
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->size());
  const int64_t context = config_.max_position_embeddings;
  if (req.max_tokens == 0 && req.max_tokens_to_context) {
    if (prompt_tokens >= context) {
      return Invalid(prompt_field, absl::StrCat(prompt_tokens,
                                                " tokens leave no room to generate in "
                                                "the context of ",
                                                context));
    }
    params->max_tokens = context - prompt_tokens;
  }
  if (prompt_tokens + params->max_tokens > context) {
    return Invalid("max_tokens",
                   absl::StrCat(prompt_tokens, " prompt tokens + ", params->max_tokens,
                                " exceed the context of ", context));
  }
  if (req.cache_prefix_tokens < 0 || req.cache_prefix_tokens > prompt_tokens) {
    return Invalid("cache_prefix_tokens", absl::StrCat(req.cache_prefix_tokens, ": must be in [0, ",
                                                       prompt_tokens, "] (the prompt's tokens)"));
  }
  params->cache_prefix_tokens = req.cache_prefix_tokens;
  if (req.cache_salt.size() > kMaxCacheSaltBytes) {
    return Invalid("cache_salt", absl::StrCat(req.cache_salt.size(), " bytes, over the limit of ",
                                              kMaxCacheSaltBytes));
  }
  params->cache_salt = req.cache_salt;
  return ValidGenerate{std::move(*prompt), std::move(*params)};
}

absl::StatusOr<std::vector<int32_t>> RequestValidator::Score(const ScoreInput& req,
                                                             const std::string& field) const {
  auto tokens = Tokens(req.input, field);
  if (!tokens.ok()) return tokens.status();
  if (tokens->size() < 2) return Invalid(field, "needs at least 2 tokens");
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
  if (absl::Status ok = FillRandom(bits, sizeof(bits)); !ok.ok()) {
    return absl::InternalError(absl::StrCat("no request id could be made: ", ok.message()));
  }
  return absl::StrCat("req-", absl::BytesToHexString(absl::string_view(
                                  reinterpret_cast<const char*>(bits), sizeof(bits))));
}

}  // namespace deltaserve
