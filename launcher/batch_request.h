// The requests of `deltaserve batch`: one JSON object per input line, read
// into plain values and checked the way the gRPC API checks its requests
// (runtime/serving/server.cc: the same defaults, limits and wording, with
// the JSON field names). docs/batch.md describes the format.
//
// A line becomes one or more units, each one sequence for the engine: a
// generate or score request is one unit; the long-document form
// {"document", "questions"} is one unit per question, whose prompt is the
// document's tokens followed by the question's (each encoded on its own, so
// every question shares the document's tokens as an exact prefix, which the
// engine prefills once and forks: runtime/scheduler/scheduler.h, kPrefix).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kernels/sampling.h"
#include "runtime/model/config.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

// Text, or token ids given as such.
struct BatchInput {
  bool is_text = false;
  std::string text;
  std::vector<int32_t> tokens;
};

struct BatchGenerateOptions {
  int64_t max_tokens = 16;  // 0 in the request means 16, as in the API
  kernels::SamplingParams sampling;
  bool has_top_p = false;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings: end the text, not part of it
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;     // each generated token's log-prob
  int32_t top_logprobs = 0;  // 0..20 alternatives per token (implies logprobs)
};

enum class BatchTask { kGenerate, kScore };

// One input line, parsed. `id_json` is the request's id as compact JSON (a
// string or an integer): what the output records carry and resume matches.
struct BatchRequest {
  int64_t line = 0;  // 1-based
  std::string id_json;
  BatchTask task = BatchTask::kGenerate;
  BatchInput input;  // generate and score
  bool long_document = false;
  BatchInput document;
  std::vector<BatchInput> questions;
  BatchGenerateOptions options;
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
// exception. Checks everything that needs no model: JSON syntax, numbers a
// double cannot hold, nesting (at most 16 levels), JSON types, unknown
// fields, value ranges. Errors name the field ("top_p: 1.5: must be in (0,
// 1]", "questions[1]: empty", "temperature: 1e400: a number out of the
// range of a double").
std::variant<BatchRequest, BatchLineError> ParseBatchLine(std::string_view line,
                                                          int64_t line_number);

// One sequence to run.
struct BatchUnit {
  std::string id_json;
  int question = -1;  // the long-document form: the question's index
  int64_t line = 0;
  BatchTask task = BatchTask::kGenerate;
  // Resolved: the prompt's token ids, checked against the model. Unresolved
  // (a client without the model's tokenizer): `input` is sent as it is and
  // the server checks it.
  bool resolved = false;
  std::vector<int32_t> prompt;
  // The long-document form: how many of `prompt`'s tokens are the document,
  // which the engine prefills once and forks for each question.
  int64_t document_tokens = 0;
  BatchInput input;
  BatchGenerateOptions options;
  std::string error;  // non-empty: the unit failed its checks, and this is why
};

// The unit for people, in progress lines: `id "doc"`, `id "doc" question 2`.
std::string UnitName(const BatchUnit& unit);

// What the checks against a model need: its config and its tokenizer (null
// when it has none: text is refused, as the API refuses it).
struct BatchModel {
  ModelConfig config;
  const Tokenizer* tokenizer = nullptr;
};

// The request's units, resolved against `model` (text encoded, ids and
// lengths checked, as the API checks them), or, with no model, as given.
// The long-document form with text needs the tokenizer to cut the prompt
// the way the engine will: without a model its units fail.
std::vector<BatchUnit> UnitsOf(const BatchRequest& request, const BatchModel* model);

// The resume key of a record: the id and the question's index, or the line
// for a record whose request had no usable id.
std::string RecordKey(const std::string& id_json, int question, int64_t line);

}  // namespace deltaserve
