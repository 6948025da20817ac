// The tiktoken BPE of Kimi K2 / Kimi Linear / K3 checkpoints:
//   tiktoken.model         lines `<base64 of token bytes> <rank>`; rank = id
//   tokenizer_config.json  added_tokens_decoder ("id" -> {"content": ...})
//                          names some of the 256 reserved special tokens that
//                          follow the ranks; eos_token
//   tokenization_kimi.py   (optional) the pre-tokenization pattern, pat_str
// Encoding is tiktoken's: special tokens split out first (when allowed), the
// rest pre-tokenized by the pattern, each piece one id when it is a token,
// else merged from bytes by lowest rank (_byte_pair_merge).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/tokenizer/pretokenize.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

// Token bytes -> rank. Views into storage the owner keeps alive.
using BpeRanks = std::unordered_map<std::string_view, int32_t>;

// tiktoken's _byte_pair_merge: starting from single bytes, repeatedly merges
// the adjacent pair whose concatenation has the lowest rank (the leftmost on
// ties) until no adjacent pair is a token. Returns the part boundaries:
// offsets 0 = b[0] < b[1] < ... < b[k] = piece.size() (piece.size() >= 1).
// The quadratic form is tiktoken's own, fastest for the short pieces of real
// text; the heap form gives the same parts in O(n log n) for long pieces
// (e.g. a run of thousands of spaces).
std::vector<size_t> BytePairMergeQuadratic(const BpeRanks& ranks, std::string_view piece);
std::vector<size_t> BytePairMergeHeap(const BpeRanks& ranks, std::string_view piece);

// Appends the ids of one pre-tokenized piece: its rank when it is a token,
// else the ranks of the merged parts. An error when a part has no rank (a byte
// missing from the vocabulary).
absl::Status BytePairEncode(const BpeRanks& ranks, std::string_view piece,
                            std::vector<int32_t>* ids);

// Kimi reserves this many special ids right after the BPE ranks.
inline constexpr int32_t kKimiReservedSpecialTokens = 256;

class TiktokenTokenizer final : public Tokenizer {
 public:
  // Loads DIR/tiktoken.model, DIR/tokenizer_config.json (optional) and
  // DIR/tokenization_kimi.py (optional: else the built-in Kimi pattern).
  // Errors name the file and line or key. The BPE ranks plus the 256 special
  // ids must fit below vocab_size.
  static absl::StatusOr<std::unique_ptr<TiktokenTokenizer>> Load(const std::string& dir,
                                                                 int64_t vocab_size);

  std::string name() const override { return "tiktoken"; }
  int64_t vocab_size() const override { return vocab_size_; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool allow_special = false) const override;
  absl::StatusOr<std::string> TokenBytes(int32_t id) const override;
  const std::vector<int32_t>& end_ids() const override { return end_ids_; }

  int32_t num_bpe_tokens() const { return static_cast<int32_t>(bpe_tokens_.size()); }
  // The id of a special token's text, or -1.
  int32_t SpecialId(std::string_view text) const;

 private:
  TiktokenTokenizer() = default;
  absl::Status LoadRanks(const std::string& path);
  absl::Status LoadSpecialTokens(const std::string& config_path);
  absl::Status EncodeOrdinary(std::string_view text, std::vector<std::string_view>* pieces,
                              std::vector<int32_t>* ids) const;
  // The special token starting at text[pos] (the longest, should one be a
  // prefix of another), or -1.
  int32_t SpecialAt(std::string_view text, size_t pos, size_t* length) const;

  int64_t vocab_size_ = 0;
  std::vector<std::string> bpe_tokens_;                        // [num_bpe_tokens], by rank
  BpeRanks ranks_;                                             // views into bpe_tokens_
  std::vector<std::string> special_tokens_;                    // [256]: id num_bpe_tokens + i
  std::unordered_map<std::string_view, int32_t> special_ids_;  // views into special_tokens_
  std::vector<size_t> special_lengths_;                        // distinct lengths, longest first
  std::array<bool, 256> special_first_byte_{};
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::vector<int32_t> end_ids_;
};

}  // namespace deltaserve
