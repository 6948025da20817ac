#include "runtime/tokenizer/tokenizer.h"

#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/byte_tokenizer.h"
#include "runtime/tokenizer/tiktoken_bpe.h"
#include "runtime/tokenizer/utf8.h"

namespace deltaserve {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir,
                                                         int64_t vocab_size) {
  if (std::filesystem::exists(std::filesystem::path(dir) / "tiktoken.model")) {
    DELTASERVE_ASSIGN_OR_RETURN(auto tiktoken, TiktokenTokenizer::Load(dir, vocab_size));
    return std::unique_ptr<Tokenizer>(std::move(tiktoken));
  }
  if (vocab_size >= 256) return std::make_unique<ByteTokenizer>(vocab_size);
  return absl::NotFoundError(
      absl::StrCat(dir, " has no tiktoken.model and its vocab_size ", vocab_size,
                   " is below 256, too small for the byte tokenizer: no tokenizer: use token ids"));
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer)
    : tokenizer_(&tokenizer) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Add(int32_t id) {
  DELTASERVE_ASSIGN_OR_RETURN(const std::string bytes, tokenizer_->TokenBytes(id));
  pending_ += bytes;
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t length = 0;
    const Utf8Step step = NextUtf8(std::string_view(pending_).substr(pos), &length);
    if (step == Utf8Step::kIncomplete) break;  // wait for the rest of the character
    if (step == Utf8Step::kComplete) {
      out.append(pending_, pos, length);
    } else {
      out += kReplacementCharacter;
    }
    pos += length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::Finish() {
  // What is held is one unfinished character: one maximal invalid subpart.
  std::string out = pending_.empty() ? "" : std::string(kReplacementCharacter);
  pending_.clear();
  return out;
}

}  // namespace deltaserve
