// The one request model every front end maps onto: the gRPC Generation API
// (grpc_request.h), the OpenAI HTTP API (openai_api.h) and `deltaserve
// batch` decode their own wire formats into these plain values, and one
// validator (request_validation.h) checks them against the model and the
// limits, so that the same bad input gets the same error from each. Nothing
// here is checked yet: numbers are as wide as any wire format sends them
// (a JSON integer, a double), so that a value out of range is refused by
// the validator rather than cut short on the way in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/tokenizer/chat_format.h"

namespace deltaserve {

// A prompt, or a document to score: text (tokenized by the model's
// tokenizer), token ids as given, or a conversation (rendered by the
// model's chat format, its special tokens only where the format puts them).
struct PromptInput {
  enum class Form { kNone, kText, kIds, kChat };
  Form form = Form::kNone;
  std::string text;
  std::vector<int64_t> ids;
  ChatRequest chat;

  static PromptInput Text(std::string text) {
    PromptInput p;
    p.form = Form::kText;
    p.text = std::move(text);
    return p;
  }
  static PromptInput Ids(std::vector<int64_t> ids) {
    PromptInput p;
    p.form = Form::kIds;
    p.ids = std::move(ids);
    return p;
  }
  static PromptInput Chat(ChatRequest chat) {
    PromptInput p;
    p.form = Form::kChat;
    p.chat = std::move(chat);
    return p;
  }
};

struct GenerateInput {
  std::string request_id;  // empty: the server makes one
  PromptInput prompt;
  double temperature = 0;       // 0: greedy
  int64_t top_k = 0;            // 0: no limit
  std::optional<double> top_p;  // unset: 1
  uint64_t seed = 0;
  // 0: kDefaultMaxTokens, or the rest of the context with
  // max_tokens_to_context (the OpenAI chat API's default).
  int64_t max_tokens = 0;
  bool max_tokens_to_context = false;
  std::vector<std::string> stop;        // stop strings: end the text, not part of it
  std::vector<int64_t> stop_token_ids;  // part of the output
  bool logprobs = false;                // the sampled token's log-prob
  int64_t top_logprobs = 0;             // alternatives per token (implies logprobs)
  bool ignore_eos = false;
  // The prompt's first tokens that later requests will share: the prefix
  // cache keeps the state at the last page boundary within them too.
  int64_t cache_prefix_tokens = 0;
  // Only requests of the same salt (and principal) share prefix cache
  // entries; at most kMaxCacheSaltBytes.
  std::string cache_salt;
};

inline constexpr size_t kMaxCacheSaltBytes = 256;

struct ScoreInput {
  std::string request_id;
  PromptInput input;
};

}  // namespace deltaserve
