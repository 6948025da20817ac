// Validation of every front end's requests (request.h): each field of a
// GenerateInput or ScoreInput is checked against the model and the request
// limits before anything is queued, and a refusal names the field (as the
// JSON APIs spell it: `temperature`, `prompt[3]`, `stop[1]`), the size and
// the flag that sets the limit (INVALID_ARGUMENT for a request over a fixed
// or configured size, RESOURCE_EXHAUSTED when the server is busy
// tokenizing). Kept apart from the servers so that it can be unit-tested and
// fuzzed (tests/fuzz/request_validation_fuzz.cc). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/config.h"
#include "runtime/serving/coordinator.h"
#include "runtime/serving/request.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

// The configurable limits (docs/security.md, Limits lists them with the fixed
// ones below). Defaults suit any real model; the flags of `deltaserve serve`
// and `coordinator` set them.
struct RequestLimits {
  // A request's text, or its token ids at 4 bytes each
  // (--max-request-bytes).
  int64_t max_request_bytes = 64 << 20;
  // Text is refused before tokenizing when it has more bytes than this times
  // the model's context: no token of a real vocabulary is that long on
  // average (--max-text-bytes-per-token).
  int64_t max_text_bytes_per_token = 32;
  // stop_token_ids entries (--max-stop-token-ids).
  int64_t max_stop_token_ids = 256;
  // Texts being tokenized at once, over all requests; one more is refused
  // with RESOURCE_EXHAUSTED (--max-concurrent-tokenizations).
  int64_t max_concurrent_tokenizations = 16;
  // A Generate stream whose client has not read for this long is cancelled
  // and its sequence freed (--client-write-timeout).
  double client_write_timeout_s = 60;
  // A request's prompt tokens, a conversation's as its chat template
  // renders them (a message of one character renders to about thirty),
  // counted before admission (--max-prompt-tokens); 0: the model's context.
  int64_t max_prompt_tokens = 0;
};

// Fixed limits: they bound what a client can make the server hold, and no
// real use comes near them.
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr int kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 1024;
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr int64_t kDefaultMaxTokens = 16;

// A checked GenerateInput, ready for Coordinator::SubmitGenerate.
struct ValidGenerate {
  std::vector<int32_t> prompt;
  GenerateParams params;
};

class RequestValidator {
 public:
  // `tokenizer` may be null (token ids only), and `chat` (no conversations);
  // all must outlive this.
  RequestValidator(const ModelConfig& config, const Tokenizer* tokenizer, RequestLimits limits,
                   const ChatFormat* chat = nullptr);

  // Errors about the prompt name `prompt_field` (a front end's name for
  // it: `prompt`, batch's `text` or `tokens`), or `messages`.
  absl::StatusOr<ValidGenerate> Generate(const GenerateInput& req,
                                         const std::string& prompt_field = "prompt") const;
  // The scored tokens (at least 2).
  absl::StatusOr<std::vector<int32_t>> Score(const ScoreInput& req,
                                             const std::string& field = "input") const;
  // A prompt's, or a part of one's, token ids (in the vocabulary, within the
  // context and the limits); errors name `field`.
  absl::StatusOr<std::vector<int32_t>> Tokens(const PromptInput& input,
                                              const std::string& field) const;
  // The client's id when it fits, else 128 random bits in hex ("req-...").
  absl::StatusOr<std::string> RequestId(const std::string& given) const;

  const RequestLimits& limits() const { return limits_; }
  // The most text bytes tokenized for one request.
  int64_t max_text_bytes() const;

 private:
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                const std::string& field) const;
  // A conversation rendered by the chat format, and its ids.
  absl::StatusOr<std::vector<int32_t>> RenderChat(const ChatRequest& chat) const;
  // A size over the text limits, as Tokenize refuses it.
  absl::Status CheckTextBytes(int64_t bytes, const std::string& field) const;
  // All but the prompt's fit in the context, which Generate checks.
  absl::StatusOr<GenerateParams> Params(const GenerateInput& req) const;

  const ModelConfig& config_;
  const Tokenizer* const tokenizer_;
  const RequestLimits limits_;
  const ChatFormat* const chat_;
  mutable std::atomic<int64_t> tokenizing_{0};
};

}  // namespace deltaserve
