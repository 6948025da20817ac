// Pre-tokenization: the text is split into pieces by a regular expression
// before BPE, as tiktoken does (successive leftmost matches, Perl-style
// leftmost-first alternation, as fancy_regex's find_iter gives them). The
// pattern is Kimi's, read from a checkpoint's tokenization_kimi.py when it has
// one. Oniguruma runs it: it has what the pattern needs (Unicode properties and
// scripts, class intersection `&&`, inline `(?i:...)`, lookahead), and its
// compiled regex is read-only during a search, so one PreTokenizer serves all
// threads with a match region per call.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct re_pattern_buffer;  // Oniguruma's regex_t; <oniguruma.h> stays in the .cc

namespace deltaserve {

// The built-in Kimi pattern (the pieces of tokenization_kimi.py's
// `pat_str = "|".join([...])`), joined with "|".
std::string KimiPattern();

// Reads `pat_str = "|".join([...])` from tokenization_kimi.py's text: the
// string literals of the list (raw or without backslashes; adjacent literals
// concatenate, as in Python), joined with "|". `source` names the file in
// errors.
absl::StatusOr<std::string> ParsePatStr(std::string_view python_source, const std::string& source);

class PreTokenizer {
 public:
  // Compiles `pattern` (UTF-8); `source` names where it came from in errors.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(const std::string& pattern,
                                                              const std::string& source);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the successive leftmost non-empty matches in `text` (valid
  // UTF-8) to *pieces, as views into text. Bytes no branch matches are
  // skipped, as tiktoken skips them (Kimi's pattern matches everything).
  absl::Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  explicit PreTokenizer(re_pattern_buffer* regex) : regex_(regex) {}
  re_pattern_buffer* regex_;
};

}  // namespace deltaserve
