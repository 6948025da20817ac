#include "launcher/batch_request.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/common/json_reader.h"
#include "runtime/serving/request_json.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// How deep a line's arrays and objects may nest (the top object is level
// 1): {"messages": [{"content": [{"type": ...}]}]} is 4 deep, a tool's
// JSON-schema parameters deeper.
constexpr int kMaxLineDepth = 16;

const std::set<std::string> kCommonFields = {"id", "task"};
const std::set<std::string> kGenerateFields = {
    "max_tokens", "temperature",    "top_k",      "top_p",    "seed",
    "stop",       "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs"};
const std::set<std::string> kPromptFields = {"text", "tokens", "messages"};
const std::set<std::string> kChatFields = {"tools", "chat_template_kwargs"};

// Text (a string) or token ids (a list, or the proto's {"ids": [...]}).
std::optional<PromptInput> Input(const json& v, const std::string& field, JsonFields& f) {
  if (v.is_string()) return PromptInput::Text(v.get<std::string>());
  const json* list = &v;
  if (v.is_object() && v.size() == 1 && v.contains("ids")) list = &v["ids"];
  auto ids = f.Ids(*list, field);
  if (!ids) return std::nullopt;
  return PromptInput::Ids(std::move(*ids));
}

// The sampling and stopping fields, as the OpenAI API reads them.
void ReadParams(JsonFields& f, GenerateInput* in) {
  if (auto v = f.Integer("max_tokens")) in->max_tokens = *v;
  if (auto v = f.Number("temperature")) in->temperature = *v;
  if (auto v = f.Integer("top_k")) in->top_k = *v;
  in->top_p = f.Number("top_p");
  if (auto v = f.Unsigned("seed")) in->seed = *v;
  ReadStops(f, in);
  if (auto v = f.Bool("ignore_eos")) in->ignore_eos = *v;
  if (auto v = f.Bool("logprobs")) in->logprobs = *v;
  if (auto v = f.Integer("top_logprobs")) in->top_logprobs = *v;
}

}  // namespace

std::variant<BatchRequest, BatchLineError> ParseBatchLine(std::string_view line,
                                                          int64_t line_number) {
  BatchLineError error;
  error.line = line_number;
  absl::StatusOr<json> parsed = ParseJson(line, JsonLimits{kMaxLineDepth, -1, "the line"});
  if (!parsed.ok()) {
    error.message = std::string(parsed.status().message());
    return error;
  }
  const json o = *std::move(parsed);
  if (!o.is_object()) {
    error.message = "not a JSON object";
    return error;
  }
  if (!o.contains("id")) {
    error.message = "missing required field 'id'";
    return error;
  }
  const json& id = o["id"];
  if (!id.is_string() && !id.is_number_integer()) {
    error.message = absl::StrCat("id: ", ShownJson(id), ": must be a string or an integer");
    return error;
  }
  BatchRequest r;
  r.line = line_number;
  r.id_json = id.dump(-1, ' ', false, json::error_handler_t::replace);
  error.id_json = r.id_json;
  JsonFields f(o);
  r.long_document = o.contains("document") || o.contains("questions");
  if (r.long_document && o.contains("questions") && o["questions"].is_array()) {
    error.questions = static_cast<int>(o["questions"].size());
  }

  // Which fields belong here.
  if (o.contains("task")) {
    const json& task = o["task"];
    if (task == "score") {
      r.task = BatchTask::kScore;
    } else if (task != "generate") {
      f.Fail("task", absl::StrCat(ShownJson(task), ": must be \"generate\" or \"score\""));
    }
  }
  std::set<std::string> allowed = kCommonFields;
  if (r.task == BatchTask::kGenerate)
    allowed.insert(kGenerateFields.begin(), kGenerateFields.end());
  if (r.long_document) {
    allowed.insert({"document", "questions"});
  } else {
    allowed.insert(kPromptFields.begin(), kPromptFields.end());
    if (o.contains("messages")) allowed.insert(kChatFields.begin(), kChatFields.end());
  }
  for (const auto& [key, value] : o.items()) {
    if (allowed.count(key)) continue;
    if (r.task == BatchTask::kScore && kGenerateFields.count(key)) {
      f.Fail(key, "not a field of a score request");
    } else if (r.long_document && (kPromptFields.count(key) || kChatFields.count(key))) {
      f.Fail(key, "a long-document request takes document and questions instead");
    } else if (kChatFields.count(key)) {
      f.Fail(key, "only with messages");
    } else {
      f.Fail(key, "unknown field");
    }
  }
  if (f.error().ok() && r.long_document && r.task == BatchTask::kScore) {
    f.Fail("task", "the long-document form (document, questions) is for generation");
  }

  if (f.error().ok() && r.long_document) {
    if (!o.contains("document")) f.Fail("document", "missing");
    if (!o.contains("questions")) f.Fail("questions", "missing");
    if (f.error().ok()) {
      if (auto doc = Input(o["document"], "document", f)) r.document = *std::move(doc);
      const json& questions = o["questions"];
      if (!questions.is_array() || questions.empty()) {
        f.Fail("questions", "must be a non-empty list of questions (text or token ids)");
      } else {
        for (size_t i = 0; i < questions.size() && f.error().ok(); ++i) {
          if (auto q = Input(questions[i], absl::StrCat("questions[", i, "]"), f)) {
            r.questions.push_back(*std::move(q));
          }
        }
      }
    }
  } else if (f.error().ok()) {
    const int given = o.contains("text") + o.contains("tokens") + o.contains("messages");
    if (given != 1) {
      f.Fail(given == 0 ? "text" : "input", "give exactly one of text, tokens, messages");
    } else if (o.contains("messages")) {
      r.input_field = "messages";
      ChatRequest chat;
      // To score a conversation is to score it as it stands.
      chat.add_generation_prompt = r.task == BatchTask::kGenerate;
      ReadConversation(f, &chat);
      r.input.prompt = PromptInput::Chat(std::move(chat));
    } else {
      r.input_field = o.contains("text") ? "text" : "tokens";
      if (auto input = Input(o[r.input_field], r.input_field, f))
        r.input.prompt = *std::move(input);
    }
  }
  if (f.error().ok()) ReadParams(f, &r.input);
  if (!f.error().ok()) {
    error.message = std::string(f.error().message());
    return error;
  }
  return r;
}

BatchModel::BatchModel(const ModelConfig& config, const Tokenizer* tokenizer,
                       const ChatFormat* chat)
    : config(config),
      tokenizer(tokenizer),
      chat(chat),
      validator(this->config, tokenizer,
                RequestLimits{.max_request_bytes = std::numeric_limits<int64_t>::max(),
                              .max_text_bytes_per_token = std::numeric_limits<int64_t>::max(),
                              .max_stop_token_ids = std::numeric_limits<int64_t>::max(),
                              .max_concurrent_tokenizations = std::numeric_limits<int64_t>::max()},
                chat) {}

std::vector<BatchUnit> UnitsOf(const BatchRequest& r, const BatchModel* model) {
  std::vector<BatchUnit> units;
  auto unit = [&](int question) {
    BatchUnit u;
    u.id_json = r.id_json;
    u.question = question;
    u.line = r.line;
    u.task = r.task;
    u.request = r.input;
    return u;
  };
  // Resolves `u` (whose request holds its prompt) against the model.
  auto resolve = [&](BatchUnit& u, const std::string& field) {
    u.resolved = true;
    if (u.task == BatchTask::kScore) {
      auto tokens = model->validator.Score(ScoreInput{"", u.request.prompt}, field);
      if (!tokens.ok()) {
        u.error = std::string(tokens.status().message());
        return;
      }
      u.prompt = std::move(*tokens);
    } else {
      auto valid = model->validator.Generate(u.request, field);
      if (!valid.ok()) {
        u.error = std::string(valid.status().message());
        return;
      }
      u.prompt = std::move(valid->prompt);
      u.params = std::move(valid->params);
    }
    if (!u.chat()) {
      u.request.prompt = PromptInput::Ids(std::vector<int64_t>(u.prompt.begin(), u.prompt.end()));
    }
  };

  if (!r.long_document) {
    BatchUnit u = unit(-1);
    if (model != nullptr) resolve(u, r.input_field);
    units.push_back(std::move(u));
    return units;
  }

  // The long-document form: the document's tokens once, then each question's.
  auto is_text = [](const PromptInput& p) { return p.form == PromptInput::Form::kText; };
  std::string doc_error;
  std::vector<int64_t> document;
  if (model == nullptr) {
    if (is_text(r.document) || std::any_of(r.questions.begin(), r.questions.end(), is_text)) {
      doc_error =
          "document: text in the long-document form is encoded here, piece by piece: give "
          "--model DIR (for its tokenizer) or token ids";
    } else {
      document = r.document.ids;
    }
  } else if (auto tokens = model->validator.Tokens(r.document, "document"); !tokens.ok()) {
    doc_error = std::string(tokens.status().message());
  } else {
    document.assign(tokens->begin(), tokens->end());
  }
  for (size_t i = 0; i < r.questions.size(); ++i) {
    BatchUnit u = unit(static_cast<int>(i));
    if (!doc_error.empty()) {
      u.error = doc_error;
      units.push_back(std::move(u));
      continue;
    }
    const std::string field = absl::StrCat("questions[", i, "]");
    std::vector<int64_t> prompt = document;
    if (model == nullptr) {
      prompt.insert(prompt.end(), r.questions[i].ids.begin(), r.questions[i].ids.end());
    } else if (auto question = model->validator.Tokens(r.questions[i], field); !question.ok()) {
      u.error = std::string(question.status().message());
      units.push_back(std::move(u));
      continue;
    } else {
      prompt.insert(prompt.end(), question->begin(), question->end());
    }
    u.document_tokens = static_cast<int64_t>(document.size());
    // Sent as token ids; a server checks them, and its prefix cache keeps
    // the document for the other questions.
    u.request.prompt = PromptInput::Ids(std::move(prompt));
    u.request.cache_prefix_tokens = u.document_tokens;
    if (model != nullptr) resolve(u, field);
    units.push_back(std::move(u));
  }
  return units;
}

std::string RecordKey(const std::string& id_json, int question, int64_t line) {
  if (id_json.empty()) return absl::StrCat("line ", line);
  return question < 0 ? id_json : absl::StrCat(id_json, " question ", question);
}

std::string UnitName(const BatchUnit& unit) {
  return unit.question < 0 ? absl::StrCat("id ", unit.id_json)
                           : absl::StrCat("id ", unit.id_json, " question ", unit.question);
}

}  // namespace deltaserve
