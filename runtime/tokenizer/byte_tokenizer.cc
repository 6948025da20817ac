#include "runtime/tokenizer/byte_tokenizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/tokenizer/utf8.h"

namespace deltaserve {

absl::StatusOr<std::vector<int32_t>> ByteTokenizer::Encode(std::string_view text,
                                                           bool /*allow_special*/) const {
  // Any bytes would encode, but every tokenizer takes the same input: text.
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte tokenizer: invalid UTF-8 at byte offset ", bad));
  }
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = static_cast<uint8_t>(text[i]);
  }
  return ids;
}

absl::StatusOr<std::string> ByteTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte tokenizer: token id ", id, " is out of range [0, ", vocab_size_, ")"));
  }
  if (id >= 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte tokenizer: token id ", id,
                     " is unused (only ids 0..255, the byte values, are tokens)"));
  }
  return std::string(1, static_cast<char>(id));
}

}  // namespace deltaserve
