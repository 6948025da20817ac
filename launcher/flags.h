// The command-line flags of the subcommands: `--name value` or
// `--name=value`, switches without a value, a clear error for unknown or
// malformed flags, and `--help` text made from the same table the parser
// reads, so that the help cannot list a flag the command does not take.
//
// Hand-written rather than CLI11: the commands need flat flags and one level
// of subcommands (`client`), and the error messages that scripts and the
// tests look for ("unknown flag --bogus", "missing required flag --model")
// stay as they are.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/tokenizer/chat_format.h"

namespace deltaserve {

// One flag: `--name VALUE` (value non-empty: what to write there, "N",
// "DIR") or a switch (value empty).
struct FlagSpec {
  std::string name = "";   // without "--"
  std::string value = "";  // e.g. "N"; empty for a switch
  std::string help = "";   // what it does, one sentence
  // Shown as "(default: ...)"; the code's fallback is the one that applies.
  std::string default_value = "";
};

// A command: what `deltaserve --help` lists and `deltaserve CMD --help`
// prints. Subcommands (client generate, ...) are commands of their own.
struct CommandSpec {
  std::string name = "";     // "generate", "client generate"
  std::string summary = "";  // one line
  std::string usage = "";    // after the name: "--model DIR (--prompt TEXT | --tokens IDS) [flags]"
  std::vector<FlagSpec> flags = {};
  std::vector<std::string> examples = {};  // whole command lines
  std::string details = "";                // paragraphs after the flags; may be empty
  std::vector<const CommandSpec*> subcommands = {};
};

// The whole --help text of a command.
std::string HelpText(const CommandSpec& spec);

// Whether `args` ask for help: `--help` or `-h` where a flag may stand (not
// as the value of a flag that takes one).
bool WantsHelp(const CommandSpec& spec, const std::vector<std::string>& args);

// Flags of `base` followed by `more`.
std::vector<FlagSpec> Concat(std::vector<FlagSpec> base, const std::vector<FlagSpec>& more);

class Flags {
 public:
  // Parses by the spec's flags (its name leads every error).
  static absl::StatusOr<Flags> Parse(const CommandSpec& spec, const std::vector<std::string>& args);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // A memory size (ParseByteSize); the error names the flag.
  absl::StatusOr<int64_t> GetByteSize(const std::string& name, int64_t fallback) const;

 private:
  // `valued` flags take a value; `switches` take none. Names without "--".
  static absl::StatusOr<Flags> Parse(const std::string& command,
                                     const std::vector<std::string>& args,
                                     const std::set<std::string>& valued,
                                     const std::set<std::string>& switches);

  std::string command_;
  std::map<std::string, std::string> values_;
};

// "141GiB", "1.5 TiB", "4096": bytes, optionally with a KiB, MiB, GiB or TiB
// suffix (powers of 1024; "B" alone is bytes); a fractional value is rounded
// down to whole bytes. Below 2^62. The error says what is
// accepted.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

// "1,2,3" (commas and/or whitespace) to token ids; `what` names the source.
absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text,
                                                    const std::string& what);

// The ids of --tokens IDS or, when given instead, of --tokens-file F (a
// regular file of at most 64 MiB, read as ParseTokenList reads text).
absl::StatusOr<std::vector<int32_t>> TokenIdsFlag(const Flags& flags);

// A prompt (or a text to score) as every command that takes one takes it:
// exactly one of --prompt TEXT, --prompt-file F (the file's bytes as they
// are, for a text too long for the command line), --tokens IDS and
// --tokens-file F, and --messages-file F (a conversation: OpenAI's
// `messages` JSON, a list, or an object with `messages` and optionally
// `tools` and `chat_template_kwargs`, as a chat completion request has
// them). Files are regular and at most 64 MiB; a text is not empty.
struct PromptArg {
  bool is_text = false;
  std::string text;          // is_text
  std::vector<int32_t> ids;  // neither text nor chat
  bool is_chat = false;
  ChatRequest chat;  // is_chat
};
absl::StatusOr<PromptArg> PromptFlag(const Flags& flags);

// The flags' table entries, `what` naming the input ("the prompt").
std::vector<FlagSpec> PromptFlags(const std::string& what);
inline constexpr char kPromptUsage[] =
    "(--prompt TEXT | --prompt-file F | --tokens IDS | --tokens-file F | --messages-file F)";

}  // namespace deltaserve
