#include "runtime/serving/request_json.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace deltaserve {

using json = nlohmann::json;

std::string ShownJson(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

const json* JsonFields::Get(const char* key) const {
  const auto it = o_.find(key);
  if (it == o_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> JsonFields::String(const char* key) {
  const json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return Fail(key, absl::StrCat(ShownJson(*v), ": must be a string"));
  return v->get<std::string>();
}

std::optional<double> JsonFields::Number(const char* key) {
  const json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return Fail(key, absl::StrCat(ShownJson(*v), ": must be a number"));
  return v->get<double>();
}

std::optional<bool> JsonFields::Bool(const char* key) {
  const json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return Fail(key, absl::StrCat(ShownJson(*v), ": must be true or false"));
  return v->get<bool>();
}

std::optional<int64_t> JsonFields::IntegerOf(const json* v, const std::string& name) {
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned()) {
    return static_cast<int64_t>(
        std::min<uint64_t>(v->get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    // In range first: converting a double past int64's range is undefined.
    const double d = v->get<double>();
    if (d > -9.2e18 && d < 9.2e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  return Fail(name, absl::StrCat(ShownJson(*v), ": must be an integer"));
}

std::optional<uint64_t> JsonFields::Unsigned(const char* key) {
  const json* v = Get(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer() && v->get<int64_t>() >= 0) {
    return static_cast<uint64_t>(v->get<int64_t>());
  }
  return Fail(key, absl::StrCat(ShownJson(*v), ": must be an integer >= 0"));
}

std::optional<std::vector<int64_t>> JsonFields::Ids(const json& list, const std::string& name) {
  if (!list.is_array()) return Fail(name, "must be a list of token ids");
  std::vector<int64_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    auto id = IntegerOf(&list[i], absl::StrCat(name, "[", i, "]"));
    if (!id) return std::nullopt;
    ids.push_back(*id);
  }
  return ids;
}

void JsonFields::Unsupported(const char* key, const json& off, const std::string& why) {
  const json* v = Get(key);
  if (v != nullptr && *v != off) Fail(key, absl::StrCat(ShownJson(*v), ": ", why));
}

std::nullopt_t JsonFields::Fail(const std::string& field, const std::string& what) {
  if (error_.ok()) error_ = absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  return std::nullopt;
}

std::nullopt_t JsonFields::Fail(absl::Status error) {
  if (error_.ok()) error_ = std::move(error);
  return std::nullopt;
}

void ReadStops(JsonFields& f, GenerateInput* in) {
  if (const json* v = f.Get("stop"); v != nullptr && v->is_string()) {
    in->stop.push_back(v->get<std::string>());
  } else if (v != nullptr && !v->is_array()) {
    f.Fail("stop", "must be a string or a list of strings");
  } else if (v != nullptr) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) {
        f.Fail(absl::StrCat("stop[", i, "]"), "must be a string");
        break;
      }
      in->stop.push_back((*v)[i].get<std::string>());
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (auto list = f.Ids(*ids, "stop_token_ids")) in->stop_token_ids = std::move(*list);
  }
}

void ReadConversation(JsonFields& f, ChatRequest* chat) {
  if (const json* messages = f.Get("messages"); messages == nullptr) {
    f.Fail("messages", "missing: give the conversation");
  } else if (!messages->is_array()) {
    f.Fail("messages", "must be a list of messages");
  } else {
    // ParseChatMessages names each message's fields ("messages[2].role").
    auto parsed = ParseChatMessages(messages->dump(-1, ' ', false, json::error_handler_t::replace));
    if (!parsed.ok()) {
      f.Fail(parsed.status());
    } else {
      chat->messages = std::move(*parsed);
    }
  }
  if (const json* tools = f.Get("tools")) {
    if (!tools->is_array()) {
      f.Fail("tools", "must be a list of tools");
    } else if (!tools->empty()) {
      chat->tools_json = tools->dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }
  if (const json* kwargs = f.Get("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      f.Fail("chat_template_kwargs", "must be an object");
      return;
    }
    for (const auto& [key, value] : kwargs->items()) {
      const std::string name = absl::StrCat("chat_template_kwargs.", key);
      if (key == "thinking" && value.is_boolean()) {
        chat->thinking = value.get<bool>();
      } else if (key == "thinking_effort" && value.is_string()) {
        chat->thinking_effort = value.get<std::string>();
      } else if (key == "thinking" || key == "thinking_effort") {
        f.Fail(name, key == "thinking" ? "must be true or false" : "must be a string");
      } else {
        f.Fail(name, "not a switch of this server's chat formats (thinking, thinking_effort)");
      }
    }
  }
}

}  // namespace deltaserve
