#include "runtime/tokenizer/pretokenize.h"

#include <oniguruma.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/tokenizer/utf8.h"

namespace deltaserve {
namespace {

// tokenization_kimi.py of Kimi K2 / Kimi Linear / K3, piece by piece: Han
// runs; words with an optional leading non-letter (upper-then-lower and
// upper-run forms, Han excluded) and English contractions; up to 3 digits;
// punctuation runs; newlines with the whitespace before them; whitespace not
// followed by a non-space (so " word" keeps its space); other whitespace.
constexpr const char* kKimiPatternPieces[] = {
    R"([\p{Han}]+)",
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)",
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)",
    R"(\p{N}{1,3})",
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*)",
    R"(\s*[\r\n]+)",
    R"(\s+(?!\S))",
    R"(\s+)",
};

// 1-based line of `offset` in `text`, for error messages.
size_t LineOf(std::string_view text, size_t offset) {
  return 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
}

bool IsIdentifierChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Reads the items of a Python list or tuple of string literals, starting just
// after its opening bracket.
class LiteralListParser {
 public:
  LiteralListParser(std::string_view text, const std::string& source)
      : text_(text), source_(source) {}

  absl::StatusOr<std::vector<std::string>> Parse(size_t pos, char close) {
    std::vector<std::string> items;
    bool in_item = false;  // adjacent literals concatenate
    while (true) {
      pos = SkipBlank(pos);
      if (pos >= text_.size()) return Error(pos, "unterminated pat_str list");
      const char c = text_[pos];
      if (c == close) break;
      if (c == ',') {
        if (!in_item) return Error(pos, "empty item in the pat_str list");
        in_item = false;
        ++pos;
        continue;
      }
      std::string literal;
      auto end = ReadLiteral(pos, &literal);
      if (!end.ok()) return end.status();
      if (in_item) {
        items.back() += literal;
      } else {
        items.push_back(std::move(literal));
        in_item = true;
      }
      pos = *end;
    }
    if (items.empty()) return Error(pos, "the pat_str list is empty");
    return items;
  }

  absl::Status Error(size_t pos, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", LineOf(text_, pos), ": ", std::string(what)));
  }

 private:
  // Whitespace, newlines and comments.
  size_t SkipBlank(size_t pos) const {
    while (pos < text_.size()) {
      const char c = text_[pos];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\\') {
        ++pos;  // a backslash here can only be a line continuation
      } else if (c == '#') {
        while (pos < text_.size() && text_[pos] != '\n') ++pos;
      } else {
        break;
      }
    }
    return pos;
  }

  // One string literal at pos into *out; returns the offset after it.
  absl::StatusOr<size_t> ReadLiteral(size_t pos, std::string* out) const {
    const size_t start = pos;
    bool raw = false;
    while (pos < text_.size() && pos - start < 2 &&
           std::string_view("rRuUbBfF").find(text_[pos]) != std::string_view::npos) {
      const char prefix = text_[pos];
      if (prefix == 'b' || prefix == 'B' || prefix == 'f' || prefix == 'F') {
        return Error(pos, "pat_str items must be plain string literals (no b or f prefix)");
      }
      raw = raw || prefix == 'r' || prefix == 'R';
      ++pos;
    }
    if (pos >= text_.size() || (text_[pos] != '"' && text_[pos] != '\'')) {
      return Error(pos, "expected a string literal in the pat_str list");
    }
    const char quote_char = text_[pos];
    const bool triple = text_.substr(pos, 3) == std::string(3, quote_char);
    const std::string quote = triple ? std::string(3, quote_char) : std::string(1, quote_char);
    pos += quote.size();
    while (true) {
      if (pos >= text_.size()) return Error(start, "unterminated string literal");
      if (text_.compare(pos, quote.size(), quote) == 0) return pos + quote.size();
      const char c = text_[pos];
      if (c == '\n' && !triple) return Error(start, "unterminated string literal");
      if (c == '\\') {
        // Escape sequences would need Python's unescaping; Kimi's pieces are
        // raw strings, where a backslash keeps itself and the next character.
        if (!raw) return Error(pos, "backslash in a non-raw pat_str string literal");
        if (pos + 1 >= text_.size()) return Error(start, "unterminated string literal");
        out->append(text_.substr(pos, 2));
        pos += 2;
        continue;
      }
      out->push_back(c);
      ++pos;
    }
  }

  std::string_view text_;
  const std::string& source_;
};

void InitializeOniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string OnigErrorText(int code, OnigErrorInfo* info) {
  OnigUChar buffer[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int length = info != nullptr ? onig_error_code_to_str(buffer, code, info)
                                     : onig_error_code_to_str(buffer, code);
  return std::string(reinterpret_cast<const char*>(buffer), length > 0 ? length : 0);
}

}  // namespace

std::string KimiPattern() { return absl::StrJoin(kKimiPatternPieces, "|"); }

absl::StatusOr<std::string> ParsePatStr(std::string_view python_source, const std::string& source) {
  LiteralListParser parser(python_source, source);
  constexpr std::string_view kName = "pat_str";
  for (size_t pos = python_source.find(kName); pos != std::string_view::npos;
       pos = python_source.find(kName, pos + 1)) {
    if (pos > 0 && IsIdentifierChar(python_source[pos - 1])) continue;
    size_t p = pos + kName.size();
    while (p < python_source.size() && (python_source[p] == ' ' || python_source[p] == '\t')) ++p;
    if (p >= python_source.size() || python_source[p] != '=' ||
        python_source.substr(p, 2) == "==") {
      continue;
    }
    ++p;
    while (p < python_source.size() && (python_source[p] == ' ' || python_source[p] == '\t')) ++p;
    const std::string_view rest = python_source.substr(p);
    if (rest.substr(0, 9) != R"("|".join()" && rest.substr(0, 9) != R"('|'.join()") {
      continue;
    }
    p += 9;
    while (p < python_source.size() &&
           std::string_view(" \t\r\n").find(python_source[p]) != std::string_view::npos) {
      ++p;
    }
    if (p >= python_source.size() || (python_source[p] != '[' && python_source[p] != '(')) {
      return parser.Error(p, "pat_str = \"|\".join( is not followed by a list");
    }
    const char close = python_source[p] == '[' ? ']' : ')';
    auto pieces = parser.Parse(p + 1, close);
    if (!pieces.ok()) return pieces.status();
    return absl::StrJoin(*pieces, "|");
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": no `pat_str = \"|\".join([...])` with the pre-tokenization pattern"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(const std::string& pattern,
                                                                   const std::string& source) {
  InitializeOniguruma();
  OnigCompileInfo info;
  info.num_of_elements = 5;
  info.pattern_enc = ONIG_ENCODING_UTF8;
  info.target_enc = ONIG_ENCODING_UTF8;
  // Ruby syntax has class intersection and \p{Script}. Simple case folding
  // only, as Rust's regex does: (?i:'s) matches 's, 'S and 'ſ, nothing more.
  info.syntax = ONIG_SYNTAX_RUBY;
  info.option = ONIG_OPTION_NONE;
  info.case_fold_flag = 0;
  OnigErrorInfo error_info;
  OnigRegex regex = nullptr;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int code = onig_new_deluxe(&regex, begin, begin + pattern.size(), &info, &error_info);
  if (code != ONIG_NORMAL) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": cannot compile the pre-tokenization pattern: ", OnigErrorText(code, &error_info)));
  }
  return std::unique_ptr<PreTokenizer>(new PreTokenizer(regex));
}

PreTokenizer::~PreTokenizer() { onig_free(regex_); }

absl::Status PreTokenizer::Split(std::string_view text,
                                 std::vector<std::string_view>* pieces) const {
  if (text.empty()) return absl::OkStatus();
  // The compiled regex is shared and read-only; the match region is ours.
  std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(
      onig_region_new(), [](OnigRegion* r) { onig_region_free(r, 1); });
  if (region == nullptr) return absl::ResourceExhaustedError("onig_region_new failed");
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t pos = 0;
  while (pos < text.size()) {
    const int found = onig_search(regex_, str, end, str + pos, end, region.get(), ONIG_OPTION_NONE);
    if (found == ONIG_MISMATCH) break;
    if (found < 0) {
      return absl::ResourceExhaustedError(absl::StrCat("pre-tokenization at byte offset ", pos,
                                                       ": ", OnigErrorText(found, nullptr)));
    }
    const auto match_begin = static_cast<size_t>(region->beg[0]);
    const auto match_end = static_cast<size_t>(region->end[0]);
    if (match_end > match_begin) {
      pieces->push_back(text.substr(match_begin, match_end - match_begin));
      pos = match_end;
    } else {
      // An empty match (not possible with Kimi's pattern): step over one
      // character so the search moves on.
      size_t length = 1;
      NextUtf8(text.substr(match_begin), &length);
      pos = match_begin + std::max<size_t>(length, 1);
    }
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
