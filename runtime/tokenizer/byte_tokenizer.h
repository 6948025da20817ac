// The byte tokenizer of synthetic models (make-model checkpoints carry no
// tokenizer files): id = byte value, so ids 0..255 are used and the rest of
// the model's vocabulary is unused.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

class ByteTokenizer final : public Tokenizer {
 public:
  // vocab_size >= 256 (the caller checks).
  explicit ByteTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {}

  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return vocab_size_; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool allow_special = false) const override;
  absl::StatusOr<std::string> TokenBytes(int32_t id) const override;
  const std::vector<int32_t>& end_ids() const override { return end_ids_; }

 private:
  int64_t vocab_size_;
  std::vector<int32_t> end_ids_;  // always empty
};

}  // namespace deltaserve
