// The requests of `deltaserve batch`: one JSON object per input line, read
// into the request model (runtime/serving/request.h) the way the OpenAI API
// reads its bodies (runtime/serving/request_json.h) and checked by the same
// validator as every server (runtime/serving/request_validation.h), so a bad
// value gets the same error here as from `serve`. docs/batch.md describes
// the format.
//
// A line becomes one or more units, each one sequence for the engine: a
// generate or score request is one unit; the long-document form
// {"document", "questions"} is one unit per question, whose prompt is the
// document's tokens followed by the question's (each encoded on its own, so
// every question shares the document's tokens as an exact prefix, which the
// engine prefills once and forks: runtime/scheduler/scheduler.h, kPrefix).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/serving/coordinator.h"
#include "runtime/serving/request.h"
#include "runtime/serving/request_validation.h"
#include "runtime/tokenizer/chat_format.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

enum class BatchTask { kGenerate, kScore };

// One input line, parsed. `id_json` is the request's id as compact JSON (a
// string or an integer): what the output records carry and resume matches.
struct BatchRequest {
  int64_t line = 0;  // 1-based
  std::string id_json;
  BatchTask task = BatchTask::kGenerate;
  // The prompt (text, tokens or messages) and, to generate, the rest of the
  // request; batch's defaults are the gRPC API's (greedy, seed 0).
  GenerateInput input;
  std::string input_field;  // the prompt's field: "text", "tokens" or "messages"
  bool long_document = false;
  PromptInput document;
  std::vector<PromptInput> questions;
};

// A line that could not be taken as a request. `id_json` is empty when the
// line has no usable id (not JSON, no id, an id of another type, a
// duplicate): such a record is keyed by its line. `questions` > 0: a
// long-document request whose every question gets this error.
struct BatchLineError {
  int64_t line = 0;
  std::string id_json;
  int questions = 0;
  std::string message;
};

// Parses one non-blank line; any bytes give a request or an error, never an
// exception. Checks what needs no model: JSON syntax, numbers a double
// cannot hold, nesting (at most 16 levels), JSON types, unknown fields
// ("top_k: \"many\": must be an integer", "questions[1]: empty",
// "temperature: 1e400: a number out of the range of a double"); the values'
// ranges are the validator's, in UnitsOf or on the server.
std::variant<BatchRequest, BatchLineError> ParseBatchLine(std::string_view line,
                                                          int64_t line_number);

// One sequence to run.
struct BatchUnit {
  std::string id_json;
  int question = -1;  // the long-document form: the question's index
  int64_t line = 0;
  BatchTask task = BatchTask::kGenerate;
  // The request as given, or, once resolved (not a conversation), with its
  // prompt's token ids: what a server is sent. A conversation is sent as
  // one, so that the server reads the reply.
  GenerateInput request;
  // Resolved: checked against the model, `prompt` its token ids and
  // `params` what the engine runs. Unresolved (a client without the model):
  // the server checks it.
  bool resolved = false;
  std::vector<int32_t> prompt;
  GenerateParams params;
  // The long-document form: how many of `prompt`'s tokens are the document,
  // which the engine prefills once and forks for each question.
  int64_t document_tokens = 0;
  std::string error;  // non-empty: the unit failed its checks, and this is why

  bool chat() const { return request.prompt.form == PromptInput::Form::kChat; }
  bool logprobs() const { return request.logprobs || request.top_logprobs > 0; }
};

// The unit for people, in progress lines: `id "doc"`, `id "doc" question 2`.
std::string UnitName(const BatchUnit& unit);

// What the checks against a model need: its config, its tokenizer (null when
// it has none: text is refused, as the API refuses it) and chat format (null:
// conversations are refused). The limits are the input line's: a request
// holds no more than its line.
struct BatchModel {
  BatchModel(const ModelConfig& config, const Tokenizer* tokenizer, const ChatFormat* chat);
  const ModelConfig config;
  const Tokenizer* const tokenizer;
  const ChatFormat* const chat;
  const RequestValidator validator;
};

// The request's units, resolved against `model` (text encoded, everything
// checked by the validator), or, with no model, as given. The long-document
// form with text needs the tokenizer to cut the prompt the way the engine
// will: without a model its units fail.
std::vector<BatchUnit> UnitsOf(const BatchRequest& request, const BatchModel* model);

// The resume key of a record: the id and the question's index, or the line
// for a record whose request had no usable id.
std::string RecordKey(const std::string& id_json, int question, int64_t line);

}  // namespace deltaserve
