#include "runtime/tokenizer/utf8.h"

#include <cstdint>

namespace deltaserve {

Utf8Step NextUtf8(std::string_view text, size_t* length) {
  const auto lead = static_cast<uint8_t>(text[0]);
  if (lead < 0x80) {
    *length = 1;
    return Utf8Step::kComplete;
  }
  // The valid range of the second byte depends on the lead (Unicode table
  // 3-7): it is what excludes overlong forms, surrogates and > U+10FFFF.
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    *length = 1;  // a continuation byte, C0, C1 or F5..FF
    return Utf8Step::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= text.size()) {
      *length = i;
      return Utf8Step::kIncomplete;
    }
    const auto byte = static_cast<uint8_t>(text[i]);
    if (byte < lo || byte > hi) {
      *length = i;
      return Utf8Step::kInvalid;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  *length = need;
  return Utf8Step::kComplete;
}

size_t FirstInvalidUtf8(std::string_view text) {
  size_t offset = 0;
  while (offset < text.size()) {
    // ASCII runs dominate real text.
    if (static_cast<uint8_t>(text[offset]) < 0x80) {
      ++offset;
      continue;
    }
    size_t length = 0;
    if (NextUtf8(text.substr(offset), &length) != Utf8Step::kComplete) {
      return offset;
    }
    offset += length;
  }
  return std::string_view::npos;
}

}  // namespace deltaserve
