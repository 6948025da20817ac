#include "runtime/tokenizer/tiktoken_bpe.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "runtime/common/file_util.h"
#include "runtime/common/json_bounds.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/utf8.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// tiktoken's Rank::MAX: "no such token".
constexpr int64_t kNoRank = std::numeric_limits<int64_t>::max();

// Pieces at least this long merge with the heap: below it, the quadratic scan
// over a few parts is cheaper than heap bookkeeping.
constexpr size_t kHeapMergeMinBytes = 128;

int64_t RankOf(const BpeRanks& ranks, std::string_view bytes) {
  const auto it = ranks.find(bytes);
  return it == ranks.end() ? kNoRank : it->second;
}

// A real tiktoken.model is about 2 MiB, its tokenizer_config.json far less.
constexpr int64_t kMaxTokenizerFileBytes = 256 << 20;
constexpr int kMaxTokenizerConfigDepth = 32;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadRegularFile(path, kMaxTokenizerFileBytes);
}

std::string HexBytes(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    if (!out.empty()) out += ' ';
    absl::StrAppend(&out, absl::Hex(static_cast<uint8_t>(c), absl::kZeroPad2));
  }
  return out;
}

}  // namespace

std::vector<size_t> BytePairMergeQuadratic(const BpeRanks& ranks, std::string_view piece) {
  const size_t n = piece.size();
  // (start of part, rank of the part joined with the next one)
  std::vector<std::pair<size_t, int64_t>> parts;
  parts.reserve(n + 1);
  std::pair<int64_t, size_t> min_rank = {kNoRank, 0};
  for (size_t i = 0; i + 1 < n; ++i) {
    const int64_t rank = RankOf(ranks, piece.substr(i, 2));
    if (rank < min_rank.first) min_rank = {rank, i};
    parts.emplace_back(i, rank);
  }
  parts.emplace_back(n - 1, kNoRank);
  parts.emplace_back(n, kNoRank);

  const auto joined_rank = [&](size_t i) {
    if (i + 3 >= parts.size()) return kNoRank;
    return RankOf(ranks, piece.substr(parts[i].first, parts[i + 3].first - parts[i].first));
  };
  while (min_rank.first != kNoRank) {
    const size_t i = min_rank.second;
    if (i > 0) parts[i - 1].second = joined_rank(i - 1);
    parts[i].second = joined_rank(i);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    min_rank = {kNoRank, 0};
    for (size_t j = 0; j + 1 < parts.size(); ++j) {
      if (parts[j].second < min_rank.first) min_rank = {parts[j].second, j};
    }
  }
  std::vector<size_t> bounds(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) bounds[i] = parts[i].first;
  return bounds;
}

std::vector<size_t> BytePairMergeHeap(const BpeRanks& ranks, std::string_view piece) {
  const size_t n = piece.size();
  if (n < 2) return {0, n};
  // Parts are named by their start offset and kept as a linked list; next of
  // the last part is n. A heap entry is (rank of the part joined with its
  // next, start, version); an entry whose version is stale is skipped. The
  // smallest (rank, start) is tiktoken's choice: lowest rank, leftmost.
  std::vector<size_t> next(n), prev(n);
  std::vector<uint32_t> version(n, 0);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? n : i - 1;  // n: none
  }
  using Entry = std::tuple<int64_t, size_t, uint32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  const auto push_pair = [&](size_t i) {
    ++version[i];
    if (next[i] >= n) return;
    const int64_t rank = RankOf(ranks, piece.substr(i, next[next[i]] - i));
    if (rank != kNoRank) heap.emplace(rank, i, version[i]);
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const auto [rank, i, entry_version] = heap.top();
    heap.pop();
    if (entry_version != version[i]) continue;
    const size_t absorbed = next[i];
    next[i] = next[absorbed];
    if (next[i] < n) prev[next[i]] = i;
    version[absorbed] = std::numeric_limits<uint32_t>::max();  // dead: no entry matches
    push_pair(i);
    if (prev[i] < n) push_pair(prev[i]);
  }
  std::vector<size_t> bounds;
  for (size_t i = 0; i < n; i = next[i]) bounds.push_back(i);
  bounds.push_back(n);
  return bounds;
}

absl::Status BytePairEncode(const BpeRanks& ranks, std::string_view piece,
                            std::vector<int32_t>* ids) {
  if (piece.empty()) return absl::OkStatus();
  if (const auto it = ranks.find(piece); it != ranks.end()) {
    ids->push_back(it->second);
    return absl::OkStatus();
  }
  const std::vector<size_t> bounds = piece.size() < kHeapMergeMinBytes
                                         ? BytePairMergeQuadratic(ranks, piece)
                                         : BytePairMergeHeap(ranks, piece);
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const std::string_view part = piece.substr(bounds[i], bounds[i + 1] - bounds[i]);
    const auto it = ranks.find(part);
    if (it == ranks.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tiktoken.model has no token for the byte(s) ", HexBytes(part)));
    }
    ids->push_back(it->second);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TiktokenTokenizer>> TiktokenTokenizer::Load(const std::string& dir,
                                                                           int64_t vocab_size) {
  const std::filesystem::path root(dir);
  const std::string model_path = (root / "tiktoken.model").string();
  if (vocab_size <= 0 || vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": bad model vocab_size ", vocab_size));
  }
  std::unique_ptr<TiktokenTokenizer> tokenizer(new TiktokenTokenizer());
  tokenizer->vocab_size_ = vocab_size;
  DELTASERVE_RETURN_IF_ERROR(tokenizer->LoadRanks(model_path));
  const int64_t num_bpe = tokenizer->num_bpe_tokens();
  const int64_t last_special = num_bpe + kKimiReservedSpecialTokens - 1;
  if (last_special >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": ", num_bpe, " ranks, so Kimi's ", kKimiReservedSpecialTokens,
        " reserved special tokens take ids ", num_bpe, "..", last_special, ": special token id ",
        last_special, " is past the model's vocab_size ", vocab_size));
  }
  DELTASERVE_RETURN_IF_ERROR(
      tokenizer->LoadSpecialTokens((root / "tokenizer_config.json").string()));

  const std::string pattern_path = (root / "tokenization_kimi.py").string();
  std::string pattern, pattern_source;
  if (std::filesystem::exists(pattern_path)) {
    DELTASERVE_ASSIGN_OR_RETURN(const std::string python, ReadFile(pattern_path));
    DELTASERVE_ASSIGN_OR_RETURN(pattern, ParsePatStr(python, pattern_path));
    pattern_source = pattern_path;
  } else {
    pattern = KimiPattern();
    pattern_source = "the built-in Kimi pattern";
  }
  DELTASERVE_ASSIGN_OR_RETURN(tokenizer->pre_tokenizer_,
                              PreTokenizer::Create(pattern, pattern_source));
  return tokenizer;
}

absl::Status TiktokenTokenizer::LoadRanks(const std::string& path) {
  DELTASERVE_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  struct Entry {
    std::string bytes;
    int64_t rank;
    size_t line;
  };
  std::vector<Entry> entries;
  size_t line_number = 0;
  for (const absl::string_view raw_line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw_line);
    if (line.empty()) continue;  // tiktoken skips blank lines too
    const auto where = [&] { return absl::StrCat(path, ":", line_number, ": "); };
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "expected `<base64 token> <rank>`, got ", fields.size(), " fields"));
    }
    Entry entry;
    if (!absl::Base64Unescape(fields[0], &entry.bytes) || entry.bytes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "'", fields[0], "' is not a base64 token"));
    }
    if (!absl::SimpleAtoi(fields[1], &entry.rank) || entry.rank < 0 ||
        fields[1].find_first_not_of("0123456789") != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "rank '", fields[1], "' is not a non-negative integer"));
    }
    entry.line = line_number;
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));

  // Kimi numbers its special tokens from the count of ranks, so the ranks
  // must be exactly 0..n-1.
  const size_t n = entries.size();
  if (n > static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", n, " ranks do not fit the model's vocab_size ", vocab_size_));
  }
  bpe_tokens_.assign(n, std::string());
  std::vector<size_t> line_of_rank(n, 0);
  for (Entry& entry : entries) {
    const std::string where = absl::StrCat(path, ":", entry.line, ": ");
    if (entry.rank >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "rank ", entry.rank, " is not below the number of ranks, ", n,
                       " (ranks must be 0..", n - 1, ": the special tokens follow them)"));
    }
    const auto rank = static_cast<size_t>(entry.rank);
    if (line_of_rank[rank] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "rank ", rank, " is also on line ", line_of_rank[rank]));
    }
    line_of_rank[rank] = entry.line;
    bpe_tokens_[rank] = std::move(entry.bytes);
  }
  // Views into bpe_tokens_, which no longer changes.
  ranks_.reserve(n);
  for (size_t rank = 0; rank < n; ++rank) {
    const auto [it, inserted] =
        ranks_.emplace(std::string_view(bpe_tokens_[rank]), static_cast<int32_t>(rank));
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_of_rank[rank], ": token ", HexBytes(bpe_tokens_[rank]),
                       " is also on line ", line_of_rank[it->second]));
    }
  }
  return absl::OkStatus();
}

absl::Status TiktokenTokenizer::LoadSpecialTokens(const std::string& config_path) {
  const int32_t num_bpe = num_bpe_tokens();
  special_tokens_.resize(kKimiReservedSpecialTokens);
  for (int32_t i = 0; i < kKimiReservedSpecialTokens; ++i) {
    special_tokens_[i] = absl::StrCat("<|reserved_token_", num_bpe + i, "|>");
  }
  std::string eos_text;
  if (std::filesystem::exists(config_path)) {
    DELTASERVE_ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));
    DELTASERVE_RETURN_IF_ERROR(
        CheckJsonBounds(text, kMaxTokenizerFileBytes, kMaxTokenizerConfigDepth, config_path));
    const json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not valid JSON"));
    }
    if (!config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
    const auto bad = [&](const std::string& key, const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", key, " ", what));
    };
    if (config.contains("added_tokens_decoder") && !config["added_tokens_decoder"].is_null()) {
      const json& added = config["added_tokens_decoder"];
      if (!added.is_object()) return bad("added_tokens_decoder", "must be an object");
      for (const auto& [key, entry] : added.items()) {
        const std::string name = absl::StrCat("added_tokens_decoder[\"", key, "\"]");
        int64_t id = 0;
        if (!absl::SimpleAtoi(key, &id)) return bad(name, "has a key that is not a token id");
        if (id < num_bpe || id >= num_bpe + kKimiReservedSpecialTokens) {
          return bad(name, absl::StrCat("is outside the reserved special ids ", num_bpe, "..",
                                        num_bpe + kKimiReservedSpecialTokens - 1,
                                        " that follow tiktoken.model's ranks"));
        }
        if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
            entry["content"].get<std::string>().empty()) {
          return bad(name, "must be an object with a non-empty string \"content\"");
        }
        const std::string content = entry["content"].get<std::string>();
        if (FirstInvalidUtf8(content) != std::string_view::npos) {
          return bad(name, "content is not valid UTF-8");
        }
        special_tokens_[id - num_bpe] = content;
      }
    }
    if (config.contains("eos_token") && !config["eos_token"].is_null()) {
      const json& eos = config["eos_token"];
      if (eos.is_string()) {
        eos_text = eos.get<std::string>();
      } else if (eos.is_object() && eos.contains("content") && eos["content"].is_string()) {
        eos_text = eos["content"].get<std::string>();
      } else {
        return bad("eos_token", "must be a string or an object with a string \"content\"");
      }
    }
  }

  for (int32_t i = 0; i < kKimiReservedSpecialTokens; ++i) {
    const auto [it, inserted] = special_ids_.emplace(special_tokens_[i], num_bpe + i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": special tokens ", it->second,
                                                     " and ", num_bpe + i, " have the same text '",
                                                     special_tokens_[i], "'"));
    }
    special_lengths_.push_back(special_tokens_[i].size());
    special_first_byte_[static_cast<uint8_t>(special_tokens_[i][0])] = true;
  }
  std::sort(special_lengths_.begin(), special_lengths_.end(), std::greater<>());
  special_lengths_.erase(std::unique(special_lengths_.begin(), special_lengths_.end()),
                         special_lengths_.end());

  if (!eos_text.empty()) {
    int32_t eos_id = SpecialId(eos_text);
    if (eos_id < 0) {
      const auto it = ranks_.find(eos_text);
      if (it == ranks_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": eos_token '", eos_text, "' is not a token"));
      }
      eos_id = it->second;
    }
    end_ids_.push_back(eos_id);
  }
  // The end of a chat turn ends generation too (K2 / Kimi Linear <|im_end|>,
  // K3 <|end_of_msg|>).
  for (const char* text : {"<|im_end|>", "<|end_of_msg|>"}) {
    const int32_t id = SpecialId(text);
    if (id >= 0 && std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end()) {
      end_ids_.push_back(id);
    }
  }
  return absl::OkStatus();
}

int32_t TiktokenTokenizer::SpecialId(std::string_view text) const {
  const auto it = special_ids_.find(text);
  return it == special_ids_.end() ? -1 : it->second;
}

int32_t TiktokenTokenizer::SpecialAt(std::string_view text, size_t pos, size_t* length) const {
  for (const size_t candidate : special_lengths_) {
    if (candidate > text.size() - pos) continue;
    const auto it = special_ids_.find(text.substr(pos, candidate));
    if (it != special_ids_.end()) {
      *length = candidate;
      return it->second;
    }
  }
  return -1;
}

absl::Status TiktokenTokenizer::EncodeOrdinary(std::string_view text,
                                               std::vector<std::string_view>* pieces,
                                               std::vector<int32_t>* ids) const {
  pieces->clear();
  DELTASERVE_RETURN_IF_ERROR(pre_tokenizer_->Split(text, pieces));
  for (const std::string_view piece : *pieces) {
    DELTASERVE_RETURN_IF_ERROR(BytePairEncode(ranks_, piece, ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TiktokenTokenizer::Encode(std::string_view text,
                                                               bool allow_special) const {
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("tiktoken tokenizer: invalid UTF-8 at byte offset ", bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<std::string_view> pieces;
  if (!allow_special) {
    DELTASERVE_RETURN_IF_ERROR(EncodeOrdinary(text, &pieces, &ids));
    return ids;
  }
  // As tiktoken: the special tokens split the text first, and the ordinary
  // text between them is pre-tokenized on its own.
  size_t start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 0;
    const int32_t id =
        special_first_byte_[static_cast<uint8_t>(text[pos])] ? SpecialAt(text, pos, &length) : -1;
    if (id < 0) {
      ++pos;
      continue;
    }
    DELTASERVE_RETURN_IF_ERROR(EncodeOrdinary(text.substr(start, pos - start), &pieces, &ids));
    ids.push_back(id);
    pos += length;
    start = pos;
  }
  DELTASERVE_RETURN_IF_ERROR(EncodeOrdinary(text.substr(start), &pieces, &ids));
  return ids;
}

absl::StatusOr<std::string> TiktokenTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_) {
    return absl::InvalidArgumentError(absl::StrCat("tiktoken tokenizer: token id ", id,
                                                   " is out of range [0, ", vocab_size_, ")"));
  }
  const int32_t num_bpe = num_bpe_tokens();
  if (id < num_bpe) return bpe_tokens_[id];
  if (id < num_bpe + kKimiReservedSpecialTokens) return special_tokens_[id - num_bpe];
  return absl::InvalidArgumentError(
      absl::StrCat("tiktoken tokenizer: token id ", id, " is unused (tokens end at id ",
                   num_bpe + kKimiReservedSpecialTokens - 1, "; the model pads its vocabulary to ",
                   vocab_size_, ")"));
}

}  // namespace deltaserve
