// Text <-> token ids for the serving edge. A model directory carries either
// the Kimi tiktoken BPE (tiktoken.model, tokenizer_config.json and optionally
// tokenization_kimi.py, as the Kimi K2 / Kimi Linear / K3 checkpoints do) or
// nothing, in which case synthetic models with vocab_size >= 256 get the byte
// tokenizer (id = byte value). Decoding is per token (TokenBytes) because a
// token may hold part of a UTF-8 character; IncrementalDetokenizer turns a
// stream of ids into whole characters for streaming responses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace deltaserve {

// Implementations are immutable once loaded: every method is safe to call
// from many threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "tiktoken" or "byte".
  virtual std::string name() const = 0;
  // The model's vocab_size: ids are in [0, vocab_size). Ids the tokenizer
  // does not define (the model pads its vocabulary) are unused.
  virtual int64_t vocab_size() const = 0;
  // Text (valid UTF-8, else InvalidArgument naming the byte offset) -> ids.
  // A special token's text (e.g. "<|im_end|>") becomes the special id only
  // when allow_special; otherwise it is encoded as ordinary text.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool allow_special = false) const = 0;
  // The raw bytes of one token (not necessarily valid UTF-8 on its own); a
  // special token's text. InvalidArgument naming the id when it is out of
  // range or unused.
  virtual absl::StatusOr<std::string> TokenBytes(int32_t id) const = 0;
  // Ids that end generation (eos_token and <|im_end|>-style tokens from the
  // tokenizer files); empty for the byte tokenizer.
  virtual const std::vector<int32_t>& end_ids() const = 0;
};

// Loads DIR's tokenizer: the tiktoken BPE when DIR/tiktoken.model exists,
// else the byte tokenizer when vocab_size >= 256, else NotFound. vocab_size is
// the model's (config.json); the tokenizer's ids must fit below it.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir,
                                                         int64_t vocab_size);

// Incremental detokenization for streaming: Add(id) returns the text that
// became complete, valid UTF-8 with this token, possibly empty (the bytes of a
// character split across tokens are held until it is whole). Bytes that can
// never start or continue a valid character (0xFF, a continuation byte with no
// lead, a lead followed by a non-continuation) come out as U+FFFD at once, one
// per maximal invalid subpart, as Python's errors="replace" does. Finish()
// returns what is held as U+FFFD and resets, so the concatenation of all
// outputs equals decoding the concatenated token bytes with replacement.
// Not thread-safe (one per stream); the tokenizer must outlive it.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer);
  absl::StatusOr<std::string> Add(int32_t id);
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // an incomplete prefix of one UTF-8 character
};

}  // namespace deltaserve
