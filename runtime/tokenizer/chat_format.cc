#include "runtime/tokenizer/chat_format.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/file_util.h"
#include "runtime/common/json_bounds.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/chat_formats.h"
#include "runtime/tokenizer/utf8.h"

namespace deltaserve {
namespace chat_internal {
namespace {

using ojson = nlohmann::ordered_json;

// JSON Schemas nest, but not this deep; Dump recurses once per level.
constexpr int kMaxToolsJsonDepth = 64;

// The code point starting `text` (valid UTF-8 assumed; an invalid byte reads
// as itself) and its length.
char32_t DecodeOne(std::string_view text, size_t* length) {
  if (NextUtf8(text, length) != Utf8Step::kComplete) {
    *length = 1;
    return static_cast<unsigned char>(text[0]);
  }
  const auto byte = [&](size_t i) { return static_cast<char32_t>(text[i] & 0x3F); };
  const auto lead = static_cast<unsigned char>(text[0]);
  switch (*length) {
    case 1:
      return lead;
    case 2:
      return (static_cast<char32_t>(lead & 0x1F) << 6) | byte(1);
    case 3:
      return (static_cast<char32_t>(lead & 0x0F) << 12) | (byte(1) << 6) | byte(2);
    default:
      return (static_cast<char32_t>(lead & 0x07) << 18) | (byte(1) << 12) | (byte(2) << 6) |
             byte(3);
  }
}

// Python's str.isspace.
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's repr of a finite double, which json.dumps writes: the shortest
// digits that round-trip, positional for decimal exponents -4 < e <= 16,
// else d.ddde+XX.
void AppendPythonFloat(double value, std::string* out) {
  char buffer[64];
  const std::to_chars_result written =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string_view text(buffer, static_cast<size_t>(written.ptr - buffer));
  if (!text.empty() && text[0] == '-') {
    *out += '-';
    text.remove_prefix(1);
  }
  const size_t e = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(text.substr(e + 1)).c_str());
  const int point = exponent + 1;  // value = 0.<digits> x 10^point
  const int count = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {
    *out += digits[0];
    if (count > 1) absl::StrAppend(out, ".", digits.substr(1));
    const int magnitude = std::abs(exponent);
    absl::StrAppend(out, exponent < 0 ? "e-" : "e+", magnitude < 10 ? "0" : "", magnitude);
  } else if (point <= 0) {
    absl::StrAppend(out, "0.", std::string(static_cast<size_t>(-point), '0'), digits);
  } else if (point >= count) {
    absl::StrAppend(out, digits, std::string(static_cast<size_t>(point - count), '0'), ".0");
  } else {
    const auto split = static_cast<size_t>(point);
    absl::StrAppend(out, digits.substr(0, split), ".", digits.substr(split));
  }
}

void AppendQuoted(std::string_view text, std::string* out) {
  *out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          *out += c;
        }
    }
  }
  *out += '"';
}

// Jinja's dictsort key (str.lower, here of ASCII letters), then bytes: the
// order dictsort leaves deep-sorted keys in.
bool KimiK3KeyLess(const std::string& a, const std::string& b) {
  const std::string lower_a = absl::AsciiStrToLower(a);
  const std::string lower_b = absl::AsciiStrToLower(b);
  return lower_a != lower_b ? lower_a < lower_b : a < b;
}

void Dump(const ojson& value, JsonStyle style, std::string* out) {
  const bool compact = style == JsonStyle::kKimiK3Sorted;
  const char* item_separator = compact ? "," : ", ";
  const char* key_separator = compact ? ":" : ": ";
  switch (value.type()) {
    case ojson::value_t::null:
      *out += "null";
      return;
    case ojson::value_t::boolean:
      *out += value.get<bool>() ? "true" : "false";
      return;
    case ojson::value_t::number_integer:
      absl::StrAppend(out, value.get<int64_t>());
      return;
    case ojson::value_t::number_unsigned:
      absl::StrAppend(out, value.get<uint64_t>());
      return;
    case ojson::value_t::number_float:
      AppendPythonFloat(value.get<double>(), out);
      return;
    case ojson::value_t::string:
      AppendQuoted(value.get_ref<const std::string&>(), out);
      return;
    case ojson::value_t::array: {
      *out += '[';
      bool first = true;
      for (const ojson& item : value) {
        if (!first) *out += item_separator;
        first = false;
        Dump(item, style, out);
      }
      *out += ']';
      return;
    }
    case ojson::value_t::object: {
      std::vector<std::pair<const std::string*, const ojson*>> members;
      for (const auto& [key, item] : value.items()) members.emplace_back(&key, &item);
      if (style == JsonStyle::kPythonSorted) {
        std::stable_sort(members.begin(), members.end(),
                         [](const auto& a, const auto& b) { return *a.first < *b.first; });
      } else if (style == JsonStyle::kKimiK3Sorted) {
        std::stable_sort(members.begin(), members.end(), [](const auto& a, const auto& b) {
          return KimiK3KeyLess(*a.first, *b.first);
        });
      }
      *out += '{';
      bool first = true;
      for (const auto& [key, item] : members) {
        if (!first) *out += item_separator;
        first = false;
        AppendQuoted(*key, out);
        *out += key_separator;
        Dump(*item, style, out);
      }
      *out += '}';
      return;
    }
    default:  // binary, discarded: not from text
      *out += "null";
      return;
  }
}

const char* JsonType(const ojson& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_null()) return "null";
  if (value.is_number()) return "number";
  if (value.is_string()) return "string";
  if (value.is_object()) return "object";
  return "array";
}

// A pass of the parser over JSON text that builds nothing: it counts the
// values (a tree takes tens of times its text's size) and keeps the parser's
// words on a syntax error.
class JsonScan final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit JsonScan(int64_t max_values) : max_values_(max_values) {}
  bool null() override { return Count(); }
  bool boolean(bool /*value*/) override { return Count(); }
  bool number_integer(number_integer_t /*value*/) override { return Count(); }
  bool number_unsigned(number_unsigned_t /*value*/) override { return Count(); }
  bool number_float(number_float_t /*value*/, const string_t& /*text*/) override { return Count(); }
  bool string(string_t& /*value*/) override { return Count(); }
  bool binary(binary_t& /*value*/) override { return Count(); }
  bool start_object(std::size_t /*elements*/) override { return Count(); }
  bool key(string_t& /*key*/) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t /*elements*/) override { return Count(); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const nlohmann::json::exception& e) override {
    // "[json.exception.parse_error.101] parse error at ...": the part after
    // the bracket.
    error_ = e.what();
    if (const size_t at = error_.find("] "); at != std::string::npos) error_.erase(0, at + 2);
    error_ = absl::StrCat("not JSON: ", error_);
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool Count() {
    if (max_values_ >= 0 && ++values_ > max_values_) {
      error_ = absl::StrCat("more than ", max_values_, " JSON values, the limit");
      return false;
    }
    return true;
  }

  int64_t max_values_;
  int64_t values_ = 0;
  std::string error_;
};

// The parser's own words on why `text` is not JSON.
std::string WhyNotJson(std::string_view text) {
  JsonScan scan(-1);
  return nlohmann::json::sax_parse(text, &scan) ? "not JSON" : scan.error();
}

}  // namespace

absl::Status ScanJson(std::string_view text, int64_t max_values, const std::string& what) {
  JsonScan scan(max_values);
  if (nlohmann::json::sax_parse(text, &scan)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", scan.error()));
}

void SegmentBuilder::Text(std::string_view text) {
  if (text.empty()) return;
  if (!segments_.empty() && !segments_.back().special) {
    segments_.back().text += text;
  } else {
    segments_.push_back(ChatSegment{std::string(text), false});
  }
}

void SegmentBuilder::Special(std::string_view token) {
  segments_.push_back(ChatSegment{std::string(token), true});
}

bool IsPythonBlank(std::string_view text) { return StripPythonSpace(text).empty(); }

std::string_view StripPythonSpace(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t length = 0;
    if (!IsPythonSpace(DecodeOne(text.substr(begin), &length))) break;
    begin += length;
  }
  size_t end = begin;  // one past the last character that is not a space
  for (size_t pos = begin; pos < text.size();) {
    size_t length = 0;
    const bool space = IsPythonSpace(DecodeOne(text.substr(pos), &length));
    pos += length;
    if (!space) end = pos;
  }
  return text.substr(begin, end - begin);
}

std::string Snippet(std::string_view text) {
  constexpr size_t kMaxBytes = 48;
  if (text.size() <= kMaxBytes) return std::string(text);
  size_t cut = kMaxBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(View(text.substr(0, cut)), "...");
}

std::string QuoteJson(std::string_view text) {
  std::string out;
  AppendQuoted(text, &out);
  return out;
}

absl::StatusOr<std::optional<std::string>> ToolsJson(std::string_view tools_json, JsonStyle style) {
  DELTASERVE_RETURN_IF_ERROR(
      CheckJsonBounds(tools_json, kMaxChatTextBytes, kMaxToolsJsonDepth, "tools"));
  const ojson tools = ojson::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  if (tools.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("tools: ", WhyNotJson(tools_json)));
  }
  if (!tools.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools: must be a JSON array, not ", JsonType(tools)));
  }
  if (tools.empty()) return std::nullopt;
  // What the templates declare to the model: functions with names, as
  // OpenAI's API takes them, and no more of them than it takes.
  if (static_cast<int64_t>(tools.size()) > kMaxChatTools) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools: ", tools.size(), " tools, over the limit of ", kMaxChatTools));
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& tool = tools[i];
    const std::string name = absl::StrCat("tools[", i, "]");
    if (!tool.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be an object, not ", JsonType(tool)));
    }
    const auto type = tool.find("type");
    if (type == tool.end() || *type != "function") {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ".type: must be \"function\" (the only kind of tool)"));
    }
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ".function: required, an object"));
    }
    const auto fname = function->find("name");
    if (fname == function->end() || !fname->is_string() || fname->get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ".function.name: required, a non-empty string"));
    }
  }
  std::string out;
  Dump(tools, style, &out);
  return out;
}

absl::StatusOr<ToolArguments> ReadToolArguments(std::string_view text, const std::string& what) {
  DELTASERVE_RETURN_IF_ERROR(CheckJsonBounds(text, kMaxChatTextBytes, kMaxToolsJsonDepth, what));
  ToolArguments arguments;
  const ojson value = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return arguments;
  arguments.is_json = true;
  Dump(value, JsonStyle::kPython, &arguments.python);
  if (!value.is_object()) return arguments;
  arguments.is_object = true;
  for (const auto& [key, item] : value.items()) {
    JsonMember member{key, JsonType(item), ""};
    if (item.is_string()) {
      member.value = item.get<std::string>();
    } else {
      Dump(item, JsonStyle::kPython, &member.value);
    }
    arguments.members.push_back(std::move(member));
  }
  return arguments;
}

absl::StatusOr<std::string> TypedJsonValue(std::string_view text, std::string_view type,
                                           const std::string& what) {
  DELTASERVE_RETURN_IF_ERROR(CheckJsonBounds(text, kMaxChatTextBytes, kMaxToolsJsonDepth, what));
  const ojson value = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", Snippet(text), "' is not JSON (", WhyNotJson(text), ")"));
  }
  if (JsonType(value) != type) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", Snippet(text), "' is a JSON ",
                                                   JsonType(value), ", not ", View(type)));
  }
  std::string out;
  Dump(value, JsonStyle::kPython, &out);
  return out;
}

}  // namespace chat_internal

absl::StatusOr<ChatReply> ParseReply(const ChatFormat& format, std::string_view generated,
                                     bool thinking) {
  absl::StatusOr<ChatReply> reply = format.Parse(generated, thinking);
  if (!reply.ok()) {
    return absl::InternalError(absl::StrCat("the model's reply does not parse as its chat format: ",
                                            reply.status().message()));
  }
  return reply;
}

std::string RenderText(const std::vector<ChatSegment>& segments) {
  std::string text;
  for (const ChatSegment& segment : segments) text += segment.text;
  return text;
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatSegment>& segments,
                                                const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const ChatSegment& segment : segments) {
    DELTASERVE_ASSIGN_OR_RETURN(const std::vector<int32_t> part,
                                tokenizer.Encode(segment.text, /*allow_special=*/segment.special));
    if (segment.special && part.size() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chat format: the special token '", segment.text, "' is not one token of the ",
          tokenizer.name(), " tokenizer (it encodes to ", part.size(),
          " ids): the tokenizer's files do not have the chat format's tokens"));
    }
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<ChatFormat>> NewChatFormat(std::string_view name) {
  if (name == "kimi_k3") return chat_internal::NewKimiK3ChatFormat();
  if (name == "kimi_linear") return chat_internal::NewKimiLinearChatFormat();
  return absl::NotFoundError(absl::StrCat("no chat format '", chat_internal::View(name),
                                          "' (there are kimi_k3 and kimi_linear)"));
}

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxTokenizerConfigBytes = int64_t{16} << 20;
constexpr int kMaxTokenizerConfigDepth = 32;

// The format a chat template or a set of token texts names, if any.
std::optional<std::string_view> FormatNamedBy(const std::vector<std::string>& texts) {
  const auto has = [&](std::string_view token) {
    return std::any_of(texts.begin(), texts.end(), [&](const std::string& text) {
      return text.find(token) != std::string::npos;
    });
  };
  if (has("<|open|>") && has("<|sep|>")) return "kimi_k3";
  if (has("<|im_user|>") && has("<|im_middle|>")) return "kimi_linear";
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatFormat>> LoadChatFormat(const std::string& model_dir) {
  const std::filesystem::path root(model_dir);
  const std::string config_path = (root / "tokenizer_config.json").string();
  const std::string template_path = (root / "chat_template.jinja").string();
  std::vector<std::string> templates;
  std::vector<std::string> tokens;
  if (std::filesystem::exists(template_path)) {
    DELTASERVE_ASSIGN_OR_RETURN(std::string text,
                                ReadRegularFile(template_path, kMaxTokenizerConfigBytes));
    templates.push_back(std::move(text));
  }
  const bool has_config = std::filesystem::exists(config_path);
  if (has_config) {
    DELTASERVE_ASSIGN_OR_RETURN(const std::string text,
                                ReadRegularFile(config_path, kMaxTokenizerConfigBytes));
    DELTASERVE_RETURN_IF_ERROR(
        CheckJsonBounds(text, kMaxTokenizerConfigBytes, kMaxTokenizerConfigDepth, config_path));
    DELTASERVE_RETURN_IF_ERROR(chat_internal::ScanJson(text, -1, config_path));
    const json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
    // chat_template: a string, or a list of {"name": ..., "template": ...}.
    if (const auto it = config.find("chat_template"); it != config.end()) {
      if (it->is_string()) {
        templates.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const json& entry : *it) {
          if (entry.is_object() && entry.contains("template") && entry["template"].is_string()) {
            templates.push_back(entry["template"].get<std::string>());
          }
        }
      } else if (!it->is_null()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": chat_template must be a string or a list of templates"));
      }
    }
    if (const auto it = config.find("added_tokens_decoder");
        it != config.end() && it->is_object()) {
      for (const auto& [id, entry] : it->items()) {
        if (entry.is_object() && entry.contains("content") && entry["content"].is_string()) {
          tokens.push_back(entry["content"].get<std::string>());
        }
      }
    }
  }
  std::optional<std::string_view> format = FormatNamedBy(templates);
  if (!format) format = FormatNamedBy(tokens);
  if (format) return NewChatFormat(*format);
  return absl::NotFoundError(absl::StrCat(
      model_dir, ": no known chat format: ",
      has_config ? "tokenizer_config.json's chat template and added tokens have neither"
                 : "there is no tokenizer_config.json, and no chat_template.jinja with either",
      " <|open|> and <|sep|> (kimi_k3) ", has_config ? "nor" : "or",
      " <|im_user|> and <|im_middle|> (kimi_linear)"));
}

namespace {

constexpr const char* kRoles[] = {"system", "user", "assistant", "tool"};

// Reads one message of the OpenAI array into `out`; `where` is
// "messages[i]"; `text_bytes` counts the strings read so far.
class MessageReader {
 public:
  explicit MessageReader(int64_t* text_bytes) : text_bytes_(text_bytes) {}

  absl::Status Read(const json& message, const std::string& where, ChatMessage* out) {
    if (!message.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": must be an object, not ", message.type_name()));
    }
    const auto role_it = message.find("role");
    if (role_it == message.end() || !role_it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".role: required, a string"));
    }
    out->role = role_it->get<std::string>();
    if (std::find(std::begin(kRoles), std::end(kRoles), out->role) == std::end(kRoles)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".role: ", QuoteRole(out->role), " is not one of system, user, assistant, tool"));
    }
    const bool assistant = out->role == "assistant";
    for (const auto& [key, value] : message.items()) {
      const std::string field = absl::StrCat(where, ".", key);
      if (key == "role") continue;
      if (key == "content") {
        DELTASERVE_RETURN_IF_ERROR(ReadContent(value, field, assistant, &out->content));
      } else if (key == "name") {
        DELTASERVE_RETURN_IF_ERROR(ReadString(value, field, &out->name));
      } else if (key == "reasoning_content" && (assistant || value.is_null())) {
        DELTASERVE_RETURN_IF_ERROR(ReadString(value, field, &out->reasoning_content));
      } else if (key == "tool_calls" && (assistant || value.is_null())) {
        DELTASERVE_RETURN_IF_ERROR(ReadToolCalls(value, field, &out->tool_calls));
      } else if (key == "tool_call_id" && (out->role == "tool" || value.is_null())) {
        DELTASERVE_RETURN_IF_ERROR(ReadString(value, field, &out->tool_call_id));
      } else if (key == "reasoning_content" || key == "tool_calls" || key == "tool_call_id") {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": only ", key == "tool_call_id" ? "a tool" : "an assistant",
            " message has one, not ", assistant ? "an " : "a ", out->role, " message"));
      } else if (!value.is_null()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": not a field of a chat message this server takes"));
      }
    }
    if (!assistant && !message.contains("content")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".content: required for a ", out->role, " message"));
    }
    return absl::OkStatus();
  }

 private:
  static std::string QuoteRole(const std::string& role) {
    return chat_internal::QuoteJson(chat_internal::Snippet(role));
  }

  absl::Status Count(size_t bytes, const std::string& field) {
    const auto size = static_cast<int64_t>(bytes);
    if (size > kMaxChatTextBytes - *text_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": the messages' text passes the limit of ", kMaxChatTextBytes, " bytes in all"));
    }
    *text_bytes_ += size;
    return absl::OkStatus();
  }

  // A string or null (empty).
  absl::Status ReadString(const json& value, const std::string& field, std::string* out) {
    if (value.is_null()) return absl::OkStatus();
    if (!value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be a string, not ", value.type_name()));
    }
    *out = value.get<std::string>();
    return Count(out->size(), field);
  }

  absl::Status ReadContent(const json& value, const std::string& field, bool assistant,
                           std::string* out) {
    if (value.is_null()) {
      if (assistant) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(field, ": must be a string or an array"));
    }
    if (value.is_string()) return ReadString(value, field, out);
    if (!value.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be a string or an array of parts, not ", value.type_name()));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const json& part = value[i];
      const std::string where = absl::StrCat(field, "[", i, "]");
      if (!part.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": must be an object, not ", part.type_name()));
      }
      const auto type_it = part.find("type");
      if (type_it == part.end() || !type_it->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".type: required, a string"));
      }
      const std::string type = type_it->get<std::string>();
      if (type != "text") {
        static constexpr const char* kMedia[] = {"image_url", "image",      "input_audio",
                                                 "audio",     "video_url",  "video",
                                                 "file",      "input_image"};
        const bool media =
            std::find(std::begin(kMedia), std::end(kMedia), type) != std::end(kMedia);
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".type: ",
            media ? absl::StrCat(type, ": this model takes text only")
                  : absl::StrCat(QuoteRole(type), " is not a content part type (text)")));
      }
      for (const auto& [key, item] : part.items()) {
        if (key != "type" && key != "text" && !item.is_null()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ".", key, ": not a field of a text part"));
        }
      }
      const auto text_it = part.find("text");
      if (text_it == part.end() || !text_it->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".text: required, a string"));
      }
      const std::string& text = text_it->get_ref<const std::string&>();
      DELTASERVE_RETURN_IF_ERROR(Count(text.size(), absl::StrCat(where, ".text")));
      *out += text;
    }
    return absl::OkStatus();
  }

  absl::Status ReadToolCalls(const json& value, const std::string& field,
                             std::vector<ChatToolCall>* out) {
    if (value.is_null()) return absl::OkStatus();
    if (!value.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be an array, not ", value.type_name()));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const json& call = value[i];
      const std::string where = absl::StrCat(field, "[", i, "]");
      if (!call.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": must be an object, not ", call.type_name()));
      }
      ChatToolCall tool_call;
      for (const auto& [key, item] : call.items()) {
        const std::string item_field = absl::StrCat(where, ".", key);
        if (key == "id") {
          DELTASERVE_RETURN_IF_ERROR(ReadString(item, item_field, &tool_call.id));
        } else if (key == "type") {
          if (!item.is_null() && !(item.is_string() && item.get<std::string>() == "function")) {
            return absl::InvalidArgumentError(absl::StrCat(item_field, ": must be \"function\""));
          }
        } else if (key == "function") {
          DELTASERVE_RETURN_IF_ERROR(ReadFunction(item, item_field, &tool_call));
        } else if (!item.is_null()) {
          return absl::InvalidArgumentError(
              absl::StrCat(item_field, ": not a field of a tool call"));
        }
      }
      if (!call.contains("function")) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".function: required"));
      }
      out->push_back(std::move(tool_call));
    }
    return absl::OkStatus();
  }

  absl::Status ReadFunction(const json& value, const std::string& field, ChatToolCall* out) {
    if (!value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be an object, not ", value.type_name()));
    }
    for (const auto& [key, item] : value.items()) {
      const std::string item_field = absl::StrCat(field, ".", key);
      if (key == "name") {
        DELTASERVE_RETURN_IF_ERROR(ReadString(item, item_field, &out->name));
      } else if (key == "arguments") {
        if (!item.is_string() && !item.is_null()) {
          return absl::InvalidArgumentError(
              absl::StrCat(item_field, ": must be a string of JSON (as the API gives it), not ",
                           item.type_name()));
        }
        DELTASERVE_RETURN_IF_ERROR(ReadString(item, item_field, &out->arguments));
      } else if (!item.is_null()) {
        return absl::InvalidArgumentError(absl::StrCat(item_field, ": not a field of a function"));
      }
    }
    if (out->name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: required, a non-empty string"));
    }
    return absl::OkStatus();
  }

  int64_t* text_bytes_;
};

}  // namespace

absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(std::string_view json_text) {
  if (static_cast<int64_t>(json_text.size()) > kMaxChatJsonBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "messages: ", json_text.size(), " bytes of JSON, over the limit of ", kMaxChatJsonBytes));
  }
  // messages[i].content[j].image_url.url, the deepest a message goes, is 5
  // deep.
  DELTASERVE_RETURN_IF_ERROR(CheckJsonBounds(json_text, kMaxChatJsonBytes, 8, "messages"));
  DELTASERVE_RETURN_IF_ERROR(
      chat_internal::ScanJson(json_text, kMaxChatMessages * 256, "messages"));
  const json messages = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded()) return absl::InvalidArgumentError("messages: not JSON");
  if (!messages.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: must be an array, not ", messages.type_name()));
  }
  if (messages.empty()) return absl::InvalidArgumentError("messages: empty");
  if (static_cast<int64_t>(messages.size()) > kMaxChatMessages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "messages: ", messages.size(), " messages, over the limit of ", kMaxChatMessages));
  }
  std::vector<ChatMessage> out(messages.size());
  int64_t text_bytes = 0;
  MessageReader reader(&text_bytes);
  for (size_t i = 0; i < messages.size(); ++i) {
    DELTASERVE_RETURN_IF_ERROR(
        reader.Read(messages[i], absl::StrCat("messages[", i, "]"), &out[i]));
  }
  return out;
}

}  // namespace deltaserve
