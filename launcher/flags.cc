#include "launcher/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/common/file_util.h"
#include "runtime/common/json_reader.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/request_json.h"

namespace deltaserve {

namespace {

// Words of `text` on lines of at most `width` columns; the first line starts
// at column `indent` (the caller has written up to there), later lines are
// indented to it.
std::string Wrap(const std::string& text, size_t indent, size_t width = 100) {
  std::string out;
  size_t column = indent;
  bool line_empty = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line_empty && column + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      line_empty = true;
    }
    if (!line_empty) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    line_empty = false;
  }
  return out;
}

std::string PadTo(std::string text, size_t width) {
  if (text.size() < width) text.resize(width, ' ');
  return text;
}

}  // namespace

std::string HelpText(const CommandSpec& spec) {
  std::string out =
      absl::StrCat("deltaserve ", spec.name, ": ", spec.summary, "\n\nusage: deltaserve ",
                   spec.name, spec.usage.empty() ? "" : " ", spec.usage, "\n");
  if (!spec.subcommands.empty()) {
    out += "\ncommands:\n";
    for (const CommandSpec* sub : spec.subcommands) {
      out += absl::StrCat("  ", PadTo(sub->name, 22), " ", sub->summary, "\n");
    }
    out += absl::StrCat("\n`deltaserve ", spec.name, " COMMAND --help` shows a command's flags.\n");
  }
  if (!spec.flags.empty()) {
    out += "\nflags:\n";
    constexpr size_t kColumn = 28;
    for (const FlagSpec& f : spec.flags) {
      std::string left = absl::StrCat("  --", f.name, f.value.empty() ? "" : " ", f.value);
      if (left.size() + 2 > kColumn) {
        left += "\n" + std::string(kColumn, ' ');
      } else {
        left.resize(kColumn, ' ');
      }
      std::string help = f.help;
      if (!f.default_value.empty()) absl::StrAppend(&help, " (default: ", f.default_value, ")");
      out += left + Wrap(help, kColumn) + "\n";
    }
    out += absl::StrCat("  --help", std::string(kColumn - 8, ' '), "this text\n");
  }
  if (!spec.details.empty()) out += "\n" + spec.details + (spec.details.back() == '\n' ? "" : "\n");
  if (!spec.examples.empty()) {
    out += spec.examples.size() == 1 ? "\nexample:\n" : "\nexamples:\n";
    for (const std::string& e : spec.examples) out += "  " + e + "\n";
  }
  return out;
}

bool WantsHelp(const CommandSpec& spec, const std::vector<std::string>& args) {
  std::set<std::string> valued;
  for (const FlagSpec& f : spec.flags) {
    if (!f.value.empty()) valued.insert(f.name);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") return true;
    if (args[i].rfind("--", 0) == 0 && args[i].find('=') == std::string::npos &&
        valued.count(args[i].substr(2))) {
      ++i;  // its value
    }
  }
  return false;
}

std::vector<FlagSpec> Concat(std::vector<FlagSpec> base, const std::vector<FlagSpec>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

absl::StatusOr<Flags> Flags::Parse(const CommandSpec& spec, const std::vector<std::string>& args) {
  std::set<std::string> valued, switches;
  for (const FlagSpec& f : spec.flags) (f.value.empty() ? switches : valued).insert(f.name);
  return Parse(spec.name, args, valued, switches);
}

absl::StatusOr<Flags> Flags::Parse(const std::string& command, const std::vector<std::string>& args,
                                   const std::set<std::string>& valued,
                                   const std::set<std::string>& switches) {
  Flags flags;
  flags.command_ = command;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat(command, ": unexpected argument '", arg, "'"));
    }
    const std::string_view body = std::string_view(arg).substr(2);
    const size_t eq = body.find('=');
    const bool inline_value = eq != std::string_view::npos;
    const std::string name(body.substr(0, eq));
    std::string value = inline_value ? std::string(body.substr(eq + 1)) : "";
    if (switches.count(name)) {
      if (inline_value) {
        return absl::InvalidArgumentError(
            absl::StrCat(command, ": flag --", name, " takes no value"));
      }
      flags.values_[name] = "1";
      continue;
    }
    if (!valued.count(name)) {
      std::set<std::string> all = valued;
      all.insert(switches.begin(), switches.end());
      return absl::InvalidArgumentError(absl::StrCat(
          command, ": unknown flag --", name, " (known: --", absl::StrJoin(all, ", --"), ")"));
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(command, ": flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    flags.values_[name] = value;
  }
  return flags;
}

std::string Flags::GetString(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<std::string> Flags::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(command_, ": missing required flag --", name));
  }
  return it->second;
}

absl::StatusOr<int64_t> Flags::GetInt(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(command_, ": --", name, " must be an integer, got '", it->second, "'"));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<double> Flags::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || errno != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(command_, ": --", name, " must be a number, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  static constexpr std::pair<const char*, int> kUnits[] = {{"KiB", 10}, {"MiB", 20}, {"GiB", 30},
                                                           {"TiB", 40}, {"B", 0},    {"", 0}};
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a memory size (", why,
                     "): write bytes, or a number with KiB, MiB, GiB or TiB, e.g. 141GiB"));
  };
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < rest.size() &&
         (absl::ascii_isdigit(static_cast<unsigned char>(rest[digits])) || rest[digits] == '.')) {
    ++digits;
  }
  const std::string number(rest.substr(0, digits));
  const absl::string_view unit = absl::StripAsciiWhitespace(rest.substr(digits));
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value)) return bad("no number");
  for (const auto& [name, shift] : kUnits) {
    if (unit != name) continue;
    const double bytes = std::ldexp(value, shift);
    if (!(bytes >= 0)) return bad("negative");
    if (bytes >= std::ldexp(1.0, 62)) return bad("too large");
    return static_cast<int64_t>(bytes);
  }
  return bad(absl::StrCat("unknown unit '", unit, "'"));
}

absl::StatusOr<int64_t> Flags::GetByteSize(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  auto bytes = ParseByteSize(it->second);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(command_, ": --", name, ": ", bytes.status().message()));
  }
  return bytes;
}

absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text,
                                                    const std::string& what) {
  std::vector<int32_t> tokens;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ',' || std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ',' &&
           !std::isspace(static_cast<unsigned char>(text[j]))) {
      ++j;
    }
    const std::string item = text.substr(i, j - i);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < std::numeric_limits<int32_t>::min() ||
        v > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", item, "' (item ", tokens.size(), ") is not a token id"));
    }
    tokens.push_back(static_cast<int32_t>(v));
    i = j;
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no token ids"));
  }
  return tokens;
}

namespace {
constexpr int64_t kMaxInputFileBytes = int64_t{64} << 20;
}  // namespace

absl::StatusOr<std::vector<int32_t>> TokenIdsFlag(const Flags& flags) {
  if (!flags.Has("tokens-file")) return ParseTokenList(flags.GetString("tokens"), "--tokens");
  const std::string path = flags.GetString("tokens-file");
  DELTASERVE_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, kMaxInputFileBytes));
  return ParseTokenList(text, path);
}

namespace {

// --messages-file: a list of messages, or an object of the fields a chat
// request has for its conversation (messages, tools, chat_template_kwargs),
// read as the HTTP API and batch read them.
absl::StatusOr<ChatRequest> ReadChatFile(const std::string& path) {
  DELTASERVE_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, kMaxInputFileBytes));
  auto fail = [&](const absl::Status& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why.message()));
  };
  absl::StatusOr<nlohmann::json> parsed =
      ParseJson(text, JsonLimits{32, static_cast<int64_t>(text.size()) / 2 + 4096, "the file"});
  if (!parsed.ok()) return fail(parsed.status());
  nlohmann::json object = *std::move(parsed);
  if (object.is_array()) object = nlohmann::json{{"messages", std::move(object)}};
  if (!object.is_object()) {
    return fail(absl::InvalidArgumentError("must be a list of messages or an object"));
  }
  for (const auto& [key, value] : object.items()) {
    if (key != "messages" && key != "tools" && key != "chat_template_kwargs") {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          key, ": not a field of a conversation (messages, tools, chat_template_kwargs)")));
    }
  }
  JsonFields f(object);
  ChatRequest chat;
  ReadConversation(f, &chat);
  if (!f.error().ok()) return fail(f.error());
  return chat;
}

}  // namespace

absl::StatusOr<PromptArg> PromptFlag(const Flags& flags) {
  const int given = flags.Has("prompt") + flags.Has("prompt-file") + flags.Has("tokens") +
                    flags.Has("tokens-file") + flags.Has("messages-file");
  if (given != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt, --prompt-file, --tokens, --tokens-file, --messages-file");
  }
  PromptArg input;
  if (flags.Has("messages-file")) {
    input.is_chat = true;
    DELTASERVE_ASSIGN_OR_RETURN(input.chat, ReadChatFile(flags.GetString("messages-file")));
    return input;
  }
  if (flags.Has("tokens") || flags.Has("tokens-file")) {
    DELTASERVE_ASSIGN_OR_RETURN(input.ids, TokenIdsFlag(flags));
    return input;
  }
  input.is_text = true;
  if (flags.Has("prompt")) {
    input.text = flags.GetString("prompt");
    if (input.text.empty()) return absl::InvalidArgumentError("--prompt is empty");
    return input;
  }
  const std::string path = flags.GetString("prompt-file");
  DELTASERVE_ASSIGN_OR_RETURN(input.text, ReadRegularFile(path, kMaxInputFileBytes));
  if (input.text.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": is empty"));
  return input;
}

std::vector<FlagSpec> PromptFlags(const std::string& what) {
  std::vector<FlagSpec> flags = {
      {"prompt", "TEXT", absl::StrCat(what, ", as text (encoded by the model's tokenizer)")},
      {"prompt-file", "F", absl::StrCat(what, ", as text from a file (UTF-8, up to 64 MiB)")},
      {"tokens", "IDS", absl::StrCat(what, ", as token ids: 1,2,3 (commas and/or spaces)")},
      {"tokens-file", "F", absl::StrCat(what, ", as token ids from a file")},
      {"messages-file", "F",
       absl::StrCat(what,
                    ", as a conversation rendered by the model's chat format: OpenAI's "
                    "`messages` JSON (a list), or {\"messages\": [...], \"tools\": [...], "
                    "\"chat_template_kwargs\": {\"thinking\": false}}")},
  };
  return flags;
}

}  // namespace deltaserve
