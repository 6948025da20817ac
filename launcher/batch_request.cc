#include "launcher/batch_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/common/json_reader.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// How deep a line's arrays and objects may nest (the top object is level
// 1): the deepest a request needs is 4, {"questions": [{"ids": [...]}]}.
constexpr int kMaxLineDepth = 16;

// The API's limits (runtime/serving/server.cc).
constexpr int kMaxStops = 16;
constexpr size_t kMaxStopBytes = 1024;
constexpr int kMaxTopLogprobs = 20;
constexpr int64_t kDefaultMaxTokens = 16;

const std::set<std::string> kCommonFields = {"id", "task"};
const std::set<std::string> kGenerateFields = {
    "max_tokens", "temperature",    "top_k",      "top_p",    "seed",
    "stop",       "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs"};

// The first failure, named by field.
class Checker {
 public:
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }
  void Fail(const std::string& field, const std::string& what) {
    if (ok()) message_ = absl::StrCat(field, ": ", what);
  }

 private:
  std::string message_;
};

std::string Shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// A JSON integer in [lo, hi].
std::optional<int64_t> Integer(const json& v, const std::string& field, int64_t lo, int64_t hi,
                               Checker* check) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(hi)) return static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= lo && i <= hi) return i;
  } else {
    check->Fail(field, absl::StrCat(Shown(v), ": must be an integer"));
    return std::nullopt;
  }
  check->Fail(field, absl::StrCat(Shown(v), ": must be in [", lo, ", ", hi, "]"));
  return std::nullopt;
}

// Token ids as given: a list of integers (or the proto's {"ids": [...]});
// their range against the vocabulary is the model's check.
std::optional<std::vector<int32_t>> TokenList(const json& v, const std::string& field,
                                              Checker* check) {
  const json* list = &v;
  if (v.is_object() && v.size() == 1 && v.contains("ids")) list = &v["ids"];
  if (!list->is_array()) {
    check->Fail(field, "must be a list of token ids");
    return std::nullopt;
  }
  std::vector<int32_t> ids;
  ids.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& item = (*list)[i];
    if (!item.is_number_integer()) {
      check->Fail(absl::StrCat(field, "[", i, "]"), absl::StrCat(Shown(item), ": not a token id"));
      return std::nullopt;
    }
    const int64_t id =
        item.is_number_unsigned()
            ? static_cast<int64_t>(std::min<uint64_t>(item.get<uint64_t>(), 1ull << 40))
            : item.get<int64_t>();
    if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max()) {
      check->Fail(absl::StrCat(field, "[", i, "]"), absl::StrCat(id, " is not a token id"));
      return std::nullopt;
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  if (ids.empty()) check->Fail(field, "empty");
  return ids;
}

// Text (a string) or token ids (a list).
std::optional<BatchInput> Input(const json& v, const std::string& field, Checker* check) {
  BatchInput input;
  if (v.is_string()) {
    input.is_text = true;
    input.text = v.get<std::string>();
    if (input.text.empty()) check->Fail(field, "empty");
    return input;
  }
  auto ids = TokenList(v, field, check);
  if (!ids) return std::nullopt;
  input.tokens = std::move(*ids);
  return input;
}

std::optional<double> Number(const json& v, const std::string& field, Checker* check) {
  if (!v.is_number()) {
    check->Fail(field, absl::StrCat(Shown(v), ": must be a number"));
    return std::nullopt;
  }
  return v.get<double>();
}

std::optional<bool> Bool(const json& v, const std::string& field, Checker* check) {
  if (!v.is_boolean()) {
    check->Fail(field, absl::StrCat(Shown(v), ": must be true or false"));
    return std::nullopt;
  }
  return v.get<bool>();
}

// The sampling and stopping fields, with the API's defaults and checks.
void ReadOptions(const json& o, BatchGenerateOptions* out, Checker* check) {
  if (o.contains("max_tokens")) {
    if (auto v =
            Integer(o["max_tokens"], "max_tokens", 0, std::numeric_limits<int32_t>::max(), check)) {
      out->max_tokens = *v == 0 ? kDefaultMaxTokens : *v;
    }
  }
  if (o.contains("temperature")) {
    if (auto v = Number(o["temperature"], "temperature", check)) {
      // As a float32, which the engine takes: 1e300 would be infinity.
      if (!(*v >= 0 && *v <= std::numeric_limits<float>::max())) {
        check->Fail("temperature", absl::StrCat(*v, ": must be a finite number >= 0"));
      } else {
        out->sampling.temperature = static_cast<float>(*v);
      }
    }
  }
  if (o.contains("top_k")) {
    if (auto v = Integer(o["top_k"], "top_k", 0, std::numeric_limits<int32_t>::max(), check)) {
      out->sampling.top_k = *v;
    }
  }
  if (o.contains("top_p")) {
    if (auto v = Number(o["top_p"], "top_p", check)) {
      // The check is on the float32 the engine takes (1e-50 is 0 there); a
      // value outside (0, 1] is not converted at all.
      const float p = *v > 0 && *v <= 1 ? static_cast<float>(*v) : 0.0f;
      if (!(p > 0 && p <= 1)) check->Fail("top_p", absl::StrCat(*v, ": must be in (0, 1]"));
      out->sampling.top_p = p;
      out->has_top_p = true;
    }
  }
  if (o.contains("seed")) {
    const json& v = o["seed"];
    if (v.is_number_unsigned()) {
      out->seed = v.get<uint64_t>();
    } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
      out->seed = static_cast<uint64_t>(v.get<int64_t>());
    } else {
      check->Fail("seed", absl::StrCat(Shown(v), ": must be an integer >= 0"));
    }
  }
  if (o.contains("stop")) {
    const json& v = o["stop"];
    const json list = v.is_string() ? json::array({v}) : v;
    if (!list.is_array()) {
      check->Fail("stop", "must be a string or a list of strings");
    } else if (list.size() > kMaxStops) {
      check->Fail("stop", absl::StrCat(list.size(), " strings, over the limit of ", kMaxStops));
    } else {
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string name = absl::StrCat("stop[", i, "]");
        if (!list[i].is_string()) {
          check->Fail(name, "must be a string");
          break;
        }
        const std::string stop = list[i].get<std::string>();
        if (stop.empty()) check->Fail(name, "empty");
        if (stop.size() > kMaxStopBytes) {
          check->Fail(name, absl::StrCat(stop.size(), " bytes, over the limit of ", kMaxStopBytes));
        }
        out->stop.push_back(stop);
      }
    }
  }
  if (o.contains("stop_token_ids")) {
    const json& v = o["stop_token_ids"];
    if (!v.is_array()) {
      check->Fail("stop_token_ids", "must be a list of token ids");
    } else {
      for (size_t i = 0; i < v.size(); ++i) {
        if (auto id = Integer(v[i], absl::StrCat("stop_token_ids[", i, "]"),
                              std::numeric_limits<int32_t>::min(),
                              std::numeric_limits<int32_t>::max(), check)) {
          out->stop_token_ids.push_back(static_cast<int32_t>(*id));
        }
      }
    }
  }
  if (o.contains("ignore_eos")) {
    if (auto v = Bool(o["ignore_eos"], "ignore_eos", check)) out->ignore_eos = *v;
  }
  if (o.contains("logprobs")) {
    if (auto v = Bool(o["logprobs"], "logprobs", check)) out->logprobs = *v;
  }
  if (o.contains("top_logprobs")) {
    if (auto v = Integer(o["top_logprobs"], "top_logprobs", 0, kMaxTopLogprobs, check)) {
      out->top_logprobs = static_cast<int32_t>(*v);
      out->logprobs = out->logprobs || *v > 0;
    }
  }
}

// The error-free part of the checks against the model: ids in the
// vocabulary, the context.
void CheckTokens(const std::vector<int32_t>& tokens, const std::string& field,
                 const ModelConfig& config, Checker* check) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config.vocab_size) {
      check->Fail(
          absl::StrCat(field, "[", i, "]"),
          absl::StrCat(tokens[i], " is outside the vocabulary [0, ", config.vocab_size, ")"));
      return;
    }
  }
}

std::vector<int32_t> Resolve(const BatchInput& input, const std::string& field,
                             const BatchModel& model, Checker* check) {
  if (!input.is_text) {
    CheckTokens(input.tokens, field, model.config, check);
    return input.tokens;
  }
  if (model.tokenizer == nullptr) {
    check->Fail(field, "this model has no tokenizer; give token ids instead");
    return {};
  }
  auto encoded = model.tokenizer->Encode(input.text);
  if (!encoded.ok()) {
    check->Fail(field, std::string(encoded.status().message()));
    return {};
  }
  if (encoded->empty()) check->Fail(field, "no tokens");
  return *std::move(encoded);
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
  json o = *std::move(parsed);
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
    error.message = absl::StrCat("id: ", Shown(id), ": must be a string or an integer");
    return error;
  }
  BatchRequest r;
  r.line = line_number;
  r.id_json = id.dump(-1, ' ', false, json::error_handler_t::replace);
  error.id_json = r.id_json;
  Checker check;
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
      check.Fail("task", absl::StrCat(Shown(task), ": must be \"generate\" or \"score\""));
    }
  }
  std::set<std::string> allowed = kCommonFields;
  if (r.task == BatchTask::kGenerate)
    allowed.insert(kGenerateFields.begin(), kGenerateFields.end());
  if (r.long_document) {
    allowed.insert({"document", "questions"});
  } else {
    allowed.insert({"text", "tokens"});
  }
  for (const auto& [key, value] : o.items()) {
    if (allowed.count(key)) continue;
    if (r.task == BatchTask::kScore && kGenerateFields.count(key)) {
      check.Fail(key, "not a field of a score request");
    } else if (r.long_document && (key == "text" || key == "tokens")) {
      check.Fail(key, "a long-document request takes document and questions instead");
    } else {
      check.Fail(key, "unknown field");
    }
  }
  if (check.ok() && r.long_document && r.task == BatchTask::kScore) {
    check.Fail("task", "the long-document form (document, questions) is for generation");
  }

  if (check.ok() && r.long_document) {
    if (!o.contains("document")) check.Fail("document", "missing");
    if (!o.contains("questions")) check.Fail("questions", "missing");
    if (check.ok()) {
      if (auto doc = Input(o["document"], "document", &check)) r.document = *std::move(doc);
      const json& questions = o["questions"];
      if (!questions.is_array() || questions.empty()) {
        check.Fail("questions", "must be a non-empty list of questions (text or token ids)");
      } else {
        for (size_t i = 0; i < questions.size() && check.ok(); ++i) {
          if (auto q = Input(questions[i], absl::StrCat("questions[", i, "]"), &check)) {
            r.questions.push_back(*std::move(q));
          }
        }
      }
    }
  } else if (check.ok()) {
    if (o.contains("text") == o.contains("tokens")) {
      check.Fail(o.contains("text") ? "text" : "input", "give exactly one of text, tokens");
    } else if (auto input = Input(o.contains("text") ? o["text"] : o["tokens"],
                                  o.contains("text") ? "text" : "tokens", &check)) {
      r.input = *std::move(input);
    }
  }
  if (check.ok()) ReadOptions(o, &r.options, &check);
  if (!check.ok()) {
    error.message = check.message();
    return error;
  }
  return r;
}

std::vector<BatchUnit> UnitsOf(const BatchRequest& r, const BatchModel* model) {
  std::vector<BatchUnit> units;
  auto unit = [&](int question) {
    BatchUnit u;
    u.id_json = r.id_json;
    u.question = question;
    u.line = r.line;
    u.task = r.task;
    u.options = r.options;
    return u;
  };
  // The context rule of the API: the prompt, and the prompt with every token
  // it may generate, fit in the model's positions.
  auto check_length = [&](BatchUnit& u, const std::string& field) {
    const int64_t n = static_cast<int64_t>(u.prompt.size());
    const int64_t context = model->config.max_position_embeddings;
    Checker check;
    if (n > context) {
      check.Fail(field, absl::StrCat(n, " tokens, longer than the context of ", context));
    } else if (u.task == BatchTask::kScore && n < 2) {
      check.Fail(field, "needs at least 2 tokens");
    } else if (u.task == BatchTask::kGenerate && n + u.options.max_tokens > context) {
      check.Fail("max_tokens", absl::StrCat(n, " prompt tokens + ", u.options.max_tokens,
                                            " exceed the context of ", context));
    }
    if (!check.ok()) u.error = check.message();
  };
  // Fields the model must check: stop strings need its tokenizer, stop ids
  // its vocabulary.
  auto check_options = [&](BatchUnit& u) {
    Checker check;
    if (!u.options.stop.empty() && model->tokenizer == nullptr) {
      check.Fail("stop[0]", "this model has no tokenizer to match text against");
    }
    for (size_t i = 0; i < u.options.stop_token_ids.size(); ++i) {
      const int32_t id = u.options.stop_token_ids[i];
      if (id < 0 || id >= model->config.vocab_size) {
        check.Fail(
            absl::StrCat("stop_token_ids[", i, "]"),
            absl::StrCat(id, " is outside the vocabulary [0, ", model->config.vocab_size, ")"));
      }
    }
    if (!check.ok() && u.error.empty()) u.error = check.message();
  };
  // A unit whose prompt was resolved: the resolution's error, or the checks.
  auto resolved = [&](BatchUnit& u, const Checker& check, const std::string& field) {
    u.resolved = true;
    if (!check.ok()) {
      u.error = check.message();
      return;
    }
    check_length(u, field);
    check_options(u);
  };

  if (!r.long_document) {
    BatchUnit u = unit(-1);
    if (model == nullptr) {
      u.input = r.input;
    } else {
      const std::string field = r.input.is_text ? "text" : "tokens";
      Checker check;
      u.prompt = Resolve(r.input, field, *model, &check);
      resolved(u, check, field);
    }
    units.push_back(std::move(u));
    return units;
  }

  // The long-document form: the document's tokens once, then each question's.
  const bool needs_tokenizer =
      r.document.is_text || std::any_of(r.questions.begin(), r.questions.end(),
                                        [](const BatchInput& q) { return q.is_text; });
  Checker doc_check;
  std::vector<int32_t> document;
  if (model == nullptr) {
    if (needs_tokenizer) {
      doc_check.Fail("document",
                     "text in the long-document form is encoded here, piece by piece: give "
                     "--model DIR (for its tokenizer) or token ids");
    } else {
      document = r.document.tokens;
    }
  } else {
    document = Resolve(r.document, "document", *model, &doc_check);
  }
  for (size_t i = 0; i < r.questions.size(); ++i) {
    BatchUnit u = unit(static_cast<int>(i));
    if (!doc_check.ok()) {
      u.error = doc_check.message();
      units.push_back(std::move(u));
      continue;
    }
    const std::string field = absl::StrCat("questions[", i, "]");
    Checker check;
    std::vector<int32_t> question =
        model == nullptr ? r.questions[i].tokens : Resolve(r.questions[i], field, *model, &check);
    u.prompt = document;
    u.prompt.insert(u.prompt.end(), question.begin(), question.end());
    u.document_tokens = static_cast<int64_t>(document.size());
    if (model == nullptr) {
      // Sent as token ids; the server checks them.
      u.input.tokens = u.prompt;
    } else {
      resolved(u, check, field);
    }
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
