// UTF-8 validation for the tokenizers: Encode rejects invalid input, and
// IncrementalDetokenizer replaces invalid output bytes with U+FFFD.
#pragma once

#include <cstddef>
#include <string_view>

namespace deltaserve {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

enum class Utf8Step { kComplete, kIncomplete, kInvalid };

// What starts `text` (non-empty): a whole character (kComplete, *length its
// bytes), a valid but unfinished prefix of one that runs to the end of text
// (kIncomplete, *length == text.size()), or an invalid sequence (kInvalid,
// *length the bytes of its maximal subpart, at least 1). Overlong forms,
// surrogates and code points past U+10FFFF are invalid.
Utf8Step NextUtf8(std::string_view text, size_t* length);

// Byte offset of the first byte that is not part of a whole valid character,
// or std::string_view::npos when all of `text` is valid UTF-8.
size_t FirstInvalidUtf8(std::string_view text);

}  // namespace deltaserve
