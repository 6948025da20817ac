// The request model's fields as JSON spells them, read the same way by every
// JSON front end (the OpenAI API, openai_api.h; `deltaserve batch`'s lines,
// launcher/batch_request.h): types are checked here and named by field
// ("top_k: \"many\": must be an integer"), ranges are the validator's
// (request_validation.h), so that one bad value gets one error wherever it
// is sent. A JSON null is an absent field, as OpenAI's own API takes it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/serving/request.h"

namespace deltaserve {

// A value as an error shows it: compact JSON, at most 40 characters.
std::string ShownJson(const nlohmann::json& value);

// Reads one JSON object's fields, keeping the first error.
class JsonFields {
 public:
  explicit JsonFields(const nlohmann::json& object) : o_(object) {}

  // Null when absent or null.
  const nlohmann::json* Get(const char* key) const;
  std::optional<std::string> String(const char* key);
  std::optional<double> Number(const char* key);
  std::optional<bool> Bool(const char* key);
  // An integer: a JSON number without a fraction (1e3 is 1000), clamped to
  // int64's range (the validator's range checks then refuse it).
  std::optional<int64_t> Integer(const char* key) { return IntegerOf(Get(key), key); }
  std::optional<int64_t> IntegerOf(const nlohmann::json* v, const std::string& name);
  // An integer >= 0 that may use all 64 bits (a seed).
  std::optional<uint64_t> Unsigned(const char* key);
  // Token ids: a list of integers, `name[i]` naming a bad one.
  std::optional<std::vector<int64_t>> Ids(const nlohmann::json& list, const std::string& name);
  // A parameter the runtime does not implement, accepted only at the value
  // that means "off".
  void Unsupported(const char* key, const nlohmann::json& off, const std::string& why);

  // The first failure wins: "field: what", or an error that names its own.
  std::nullopt_t Fail(const std::string& field, const std::string& what);
  std::nullopt_t Fail(absl::Status error);
  const absl::Status& error() const { return error_; }

 private:
  const nlohmann::json& o_;
  absl::Status error_;
};

// `stop`: a string or a list of strings; `stop_token_ids`: a list of ids.
void ReadStops(JsonFields& f, GenerateInput* in);

// The conversation: `messages` (OpenAI's array, ParseChatMessages names its
// fields), `tools` and `chat_template_kwargs` (thinking, thinking_effort).
// `messages` missing is an error.
void ReadConversation(JsonFields& f, ChatRequest* chat);

}  // namespace deltaserve
