#include "runtime/tokenizer/tokenizer.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/tokenizer/byte_tokenizer.h"
#include "runtime/tokenizer/pretokenize.h"
#include "runtime/tokenizer/tiktoken_bpe.h"
#include "runtime/tokenizer/utf8.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// The model's vocab_size for the fixture: its 676 ranks + 256 special ids,
// padded as configs pad them.
constexpr int64_t kFixtureVocab = 1024;

// Whether `text` (an error message) contains `part`, showing both if not.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

std::string FixtureDir() { return std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// A copy of the fixture in a fresh directory, for tests that break a file.
std::string FixtureCopy(const std::string& tag) {
  const std::string dir = testing::TempDir(tag);
  for (const char* name : {"tiktoken.model", "tokenizer_config.json"}) {
    std::filesystem::copy_file(FixtureDir() + "/" + name, dir + "/" + name);
  }
  return dir;
}

struct Case {
  std::string text;
  std::vector<int32_t> ordinary;  // tiktoken encode_ordinary
  std::vector<int32_t> special;   // tiktoken encode(allowed_special="all")
};

struct Expected {
  int32_t num_base_tokens = 0;
  std::vector<int32_t> end_ids;
  std::vector<Case> cases;
};

const Expected& LoadExpected() {
  static const Expected expected = [] {
    Expected e;
    const json j = json::parse(ReadFile(FixtureDir() + "/expected.json"));
    e.num_base_tokens = j.at("num_base_tokens").get<int32_t>();
    e.end_ids = j.at("end_ids").get<std::vector<int32_t>>();
    for (const json& c : j.at("cases")) {
      e.cases.push_back({c.at("text").get<std::string>(),
                         c.at("ordinary").get<std::vector<int32_t>>(),
                         c.at("special").get<std::vector<int32_t>>()});
    }
    return e;
  }();
  return expected;
}

const Tokenizer& Fixture() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto loaded = LoadTokenizer(FixtureDir(), kFixtureVocab);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? std::move(*loaded) : nullptr;
  }();
  return *tokenizer;
}

std::string Decode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string text;
  for (const int32_t id : ids) {
    auto bytes = tokenizer.TokenBytes(id);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    if (bytes.ok()) text += *bytes;
  }
  return text;
}

// The fixture's ranks, read here independently of the loader.
struct Ranks {
  std::vector<std::string> tokens;
  BpeRanks ranks;
};
const Ranks& FixtureRanks() {
  static const Ranks ranks = [] {
    Ranks r;
    for (const absl::string_view line :
         absl::StrSplit(ReadFile(FixtureDir() + "/tiktoken.model"), '\n', absl::SkipEmpty())) {
      const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
      std::string bytes;
      EXPECT_TRUE(absl::Base64Unescape(fields[0], &bytes));
      EXPECT_EQ(std::stoul(std::string(fields[1])), r.tokens.size());
      r.tokens.push_back(bytes);
    }
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      r.ranks.emplace(r.tokens[i], static_cast<int32_t>(i));
    }
    return r;
  }();
  return ranks;
}

// ---------------------------------------------------------------------------
// The tiktoken BPE against the real tiktoken (tools/make_tokenizer_fixture.py)

TEST(TiktokenTest, LoadsTheFixture) {
  const Tokenizer& tokenizer = Fixture();
  const Expected& expected = LoadExpected();
  EXPECT_EQ(tokenizer.name(), "tiktoken");
  EXPECT_EQ(tokenizer.vocab_size(), kFixtureVocab);
  EXPECT_EQ(tokenizer.end_ids(), expected.end_ids);  // [EOS], <|im_end|>
  const int32_t base = expected.num_base_tokens;
  EXPECT_EQ(*tokenizer.TokenBytes(base), "[BOS]");
  EXPECT_EQ(*tokenizer.TokenBytes(base + 1), "[EOS]");
  EXPECT_EQ(*tokenizer.TokenBytes(base + 2), "<|im_end|>");
  EXPECT_EQ(*tokenizer.TokenBytes(base + 100), absl::StrCat("<|reserved_token_", base + 100, "|>"));
  EXPECT_EQ(*tokenizer.TokenBytes(base + 255), absl::StrCat("<|reserved_token_", base + 255, "|>"));
  EXPECT_EQ(*tokenizer.TokenBytes(base - 1), FixtureRanks().tokens.back());
}

TEST(TiktokenTest, EncodesExactlyAsTiktoken) {
  const Tokenizer& tokenizer = Fixture();
  ASSERT_GE(LoadExpected().cases.size(), 30u);
  for (const Case& c : LoadExpected().cases) {
    SCOPED_TRACE(c.text.substr(0, 80));
    auto ordinary = tokenizer.Encode(c.text, /*allow_special=*/false);
    ASSERT_TRUE(ordinary.ok()) << ordinary.status();
    EXPECT_EQ(*ordinary, c.ordinary);
    auto special = tokenizer.Encode(c.text, /*allow_special=*/true);
    ASSERT_TRUE(special.ok()) << special.status();
    EXPECT_EQ(*special, c.special);
    EXPECT_EQ(Decode(tokenizer, *ordinary), c.text);
    EXPECT_EQ(Decode(tokenizer, *special), c.text);
  }
}

TEST(TiktokenTest, SpecialTokensOnlyWhenAllowed) {
  const Tokenizer& tokenizer = Fixture();
  const int32_t im_end = LoadExpected().num_base_tokens + 2;
  EXPECT_EQ(*tokenizer.Encode("<|im_end|>", true), std::vector<int32_t>{im_end});
  const auto ordinary = *tokenizer.Encode("<|im_end|>", false);
  EXPECT_GT(ordinary.size(), 1u);
  for (const int32_t id : ordinary) EXPECT_LT(id, LoadExpected().num_base_tokens);
}

TEST(TiktokenTest, LongTextIsFast) {
  const Tokenizer& tokenizer = Fixture();
  std::string text;
  while (text.size() < 400000) {
    for (const Case& c : LoadExpected().cases) text += c.text;
  }
  text += std::string(100000, ' ') + "x" + std::string(50000, 'a');
  const auto start = std::chrono::steady_clock::now();
  auto ids = tokenizer.Encode(text, true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), 50000u);
  EXPECT_EQ(Decode(tokenizer, *ids), text);
  EXPECT_LT(seconds, 10.0) << ids->size() << " tokens";
}

TEST(TiktokenTest, ConcurrentEncodesAgree) {
  const Tokenizer& tokenizer = Fixture();
  const Expected& expected = LoadExpected();
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (const Case& c : expected.cases) {
          auto ids = tokenizer.Encode(c.text, (round + t) % 2 == 0);
          const auto& want = (round + t) % 2 == 0 ? c.special : c.ordinary;
          if (!ids.ok() || *ids != want) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(TiktokenTest, InvalidUtf8NamesTheOffset) {
  for (const bool allow_special : {false, true}) {
    auto ids = Fixture().Encode(std::string("abc\xFF"
                                            "def"),
                                allow_special);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(ids.status().message()), "byte offset 3"));
  }
  // Truncated, overlong, surrogate.
  for (const std::string& bad :
       {std::string("x\xE4\xBD"), std::string("xy\xC0\x80"), std::string("xyz\xED\xA0\x80")}) {
    auto ids = Fixture().Encode(bad);
    ASSERT_FALSE(ids.ok());
    EXPECT_TRUE(Contains(std::string(ids.status().message()),
                         absl::StrCat("byte offset ", bad.find_first_of("\xE4\xC0\xED"))));
  }
}

TEST(TiktokenTest, IdsOutOfRangeOrUnused) {
  const Tokenizer& tokenizer = Fixture();
  const int32_t first_unused = LoadExpected().num_base_tokens + 256;
  for (const int32_t id : {-1, static_cast<int32_t>(kFixtureVocab), 1 << 30}) {
    auto bytes = tokenizer.TokenBytes(id);
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(bytes.status().message()), absl::StrCat("id ", id)));
    EXPECT_TRUE(Contains(std::string(bytes.status().message()), "out of range"));
  }
  for (const int32_t id : {first_unused, static_cast<int32_t>(kFixtureVocab - 1)}) {
    auto bytes = tokenizer.TokenBytes(id);
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(bytes.status().message()), absl::StrCat("id ", id)));
    EXPECT_TRUE(Contains(std::string(bytes.status().message()), "unused"));
  }
}

TEST(TiktokenTest, SpecialTokenPastVocabSizeIsAnError) {
  const int32_t last_special = LoadExpected().num_base_tokens + 255;
  EXPECT_TRUE(LoadTokenizer(FixtureDir(), last_special + 1).ok());
  auto loaded = LoadTokenizer(FixtureDir(), last_special);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(loaded.status().message()),
                       absl::StrCat("special token id ", last_special)));
  EXPECT_TRUE(Contains(std::string(loaded.status().message()), "vocab_size"));
}

TEST(TiktokenTest, MalformedModelLinesNameTheFileAndLine) {
  const std::string model = ReadFile(FixtureDir() + "/tiktoken.model");
  std::vector<std::string> lines = absl::StrSplit(model, '\n', absl::SkipEmpty());
  struct Broken {
    std::string line3;
    std::string message;
  };
  const Broken broken[] = {
      {"QUJD", "fields"},                       // no rank
      {"QUJD 2 7", "fields"},                   // extra field
      {"!!notbase64 2", "not a base64 token"},  // bad base64
      {"QUJD two", "not a non-negative integer"},
      {"QUJD -2", "not a non-negative integer"},
      {"QUJD 99999", "not below the number of ranks"},
      {"QUJD 1", "also on line 2"},                                       // rank 1 twice
      {lines[0].substr(0, lines[0].find(' ')) + " 2", "also on line 1"},  // bytes twice
  };
  for (const Broken& b : broken) {
    SCOPED_TRACE(b.line3);
    const std::string dir = FixtureCopy("tok_bad_model");
    std::vector<std::string> edited = lines;
    edited[2] = b.line3;
    std::string text;
    for (const std::string& line : edited) text += line + "\n";
    WriteFile(dir + "/tiktoken.model", text);
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_FALSE(loaded.ok());
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(loaded.status().message());
    EXPECT_TRUE(Contains(message, dir + "/tiktoken.model:"));
    EXPECT_TRUE(Contains(message, b.message));
    if (b.message.find("also on line 1") == std::string::npos) {
      EXPECT_TRUE(Contains(message, "tiktoken.model:3:"));
    }
  }
}

TEST(TiktokenTest, ConfigErrorsNameTheKey) {
  const int32_t base = LoadExpected().num_base_tokens;
  const std::pair<std::string, std::string> broken[] = {
      {"{not json", "not valid JSON"},
      {R"({"added_tokens_decoder": {"5": {"content": "<x>"}}})",
       "added_tokens_decoder[\"5\"] is outside the reserved special ids"},
      {absl::StrCat(R"({"added_tokens_decoder": {")", base + 256, R"(": {"content": "<x>"}}})"),
       absl::StrCat("added_tokens_decoder[\"", base + 256, "\"] is outside")},
      {absl::StrCat(R"({"added_tokens_decoder": {")", base, R"(": {"special": true}}})"),
       "non-empty string \"content\""},
      {absl::StrCat(R"({"added_tokens_decoder": {")", base, R"(": {"content": "<a>"}, ")", base + 1,
                    R"(": {"content": "<a>"}}})"),
       "have the same text '<a>'"},
      {R"({"eos_token": "<|nope|>"})", "eos_token '<|nope|>' is not a token"},
      {R"({"eos_token": 7})", "eos_token must be a string"},
  };
  for (const auto& [config, message] : broken) {
    SCOPED_TRACE(config);
    const std::string dir = FixtureCopy("tok_bad_config");
    WriteFile(dir + "/tokenizer_config.json", config);
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_FALSE(loaded.ok());
    EXPECT_TRUE(Contains(std::string(loaded.status().message()), dir + "/tokenizer_config.json: "));
    EXPECT_TRUE(Contains(std::string(loaded.status().message()), message));
  }
}

TEST(TiktokenTest, ConfigVariants) {
  const int32_t base = LoadExpected().num_base_tokens;
  {  // No tokenizer_config.json: every special id reserved, no end ids.
    const std::string dir = FixtureCopy("tok_no_config");
    std::filesystem::remove(dir + "/tokenizer_config.json");
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE((*loaded)->end_ids().empty());
    EXPECT_EQ(*(*loaded)->TokenBytes(base + 1), absl::StrCat("<|reserved_token_", base + 1, "|>"));
  }
  {  // eos_token as an object; <|im_end|> and <|end_of_msg|> end turns.
    const std::string dir = FixtureCopy("tok_eos_object");
    WriteFile(
        dir + "/tokenizer_config.json",
        absl::StrCat(R"({"added_tokens_decoder": {")", base + 1, R"(": {"content": "[EOS]"}, ")",
                     base + 5, R"(": {"content": "<|end_of_msg|>"}, ")", base + 9,
                     R"(": {"content": "<|im_end|>"}}, "eos_token": {"content": "[EOS]"}})"));
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ((*loaded)->end_ids(), (std::vector<int32_t>{base + 1, base + 9, base + 5}));
  }
}

// ---------------------------------------------------------------------------
// Pre-tokenization pattern

// A stand-in for a checkpoint's tokenization_kimi.py, laid out as the real
// one lays out pat_str.
constexpr char kKimiPython[] = R"PY(import tiktoken

class TikTokenTokenizer:
    special_tokens: Dict[str, int]
    num_reserved_special_tokens = 256

    pat_str = "|".join(
        [
            r"""[\p{Han}]+""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    )
)PY";

TEST(PreTokenizeTest, ParsesKimiPatStr) {
  auto pattern = ParsePatStr(kKimiPython, "tokenization_kimi.py");
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  EXPECT_EQ(*pattern, KimiPattern());
  // Other literal forms; adjacent literals concatenate; comments.
  auto other = ParsePatStr(
      "x = 1\npat_str = '|'.join((r'a\\'b', \"c\" 'd',  # comment\n R'''e''',))\n", "f.py");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(*other, "a\\'b|cd|e");
}

TEST(PreTokenizeTest, PatStrErrorsNameTheFile) {
  for (const char* text : {"nothing here", "pat_str = \"|\".join([r\"a\", \"b\\n\"])",
                           "pat_str = \"|\".join([r\"a\", foo])", "pat_str = \"|\".join([r\"a\"",
                           "pat_str = \"|\".join([])"}) {
    SCOPED_TRACE(text);
    auto pattern = ParsePatStr(text, "dir/tokenization_kimi.py");
    ASSERT_FALSE(pattern.ok());
    EXPECT_TRUE(Contains(std::string(pattern.status().message()), "dir/tokenization_kimi.py"));
  }
}

TEST(PreTokenizeTest, SplitsLikeKimi) {
  auto pre = PreTokenizer::Create(KimiPattern(), "kimi");
  ASSERT_TRUE(pre.ok()) << pre.status();
  const auto split = [&](std::string_view text) {
    std::vector<std::string_view> pieces;
    EXPECT_TRUE((*pre)->Split(text, &pieces).ok());
    return std::vector<std::string>(pieces.begin(), pieces.end());
  };
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(split("中文English混合"), (Pieces{"中文", "English", "混合"}));
  EXPECT_EQ(split("北京市 Pascal"), (Pieces{"北京市", " Pascal"}));
  EXPECT_EQ(split("I don't KNOW'S"), (Pieces{"I", " don't", " KNOW'S"}));
  EXPECT_EQ(split("12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(split("a  b\n\n c"), (Pieces{"a", " ", " b", "\n\n", " c"}));
  EXPECT_EQ(split("x   "), (Pieces{"x", "   "}));
  EXPECT_EQ(split("it'ſ"), (Pieces{"it'ſ"}));  // Unicode simple case folding
  EXPECT_TRUE(split("").empty());
}

TEST(PreTokenizeTest, BadPatternIsAnError) {
  auto pre = PreTokenizer::Create("[unclosed", "somewhere.py");
  ASSERT_FALSE(pre.ok());
  EXPECT_TRUE(Contains(std::string(pre.status().message()), "somewhere.py"));
}

TEST(TiktokenTest, PatternComesFromTokenizationKimiPy) {
  const Tokenizer& builtin = Fixture();
  {  // The real layout: the same pattern, the same ids.
    const std::string dir = FixtureCopy("tok_kimi_py");
    WriteFile(dir + "/tokenization_kimi.py", kKimiPython);
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    for (const Case& c : LoadExpected().cases) {
      EXPECT_EQ(*(*loaded)->Encode(c.text, true), c.special) << c.text;
    }
  }
  {  // A different pattern takes effect: words without their leading space.
    const std::string dir = FixtureCopy("tok_other_py");
    WriteFile(dir + "/tokenization_kimi.py",
              "pat_str = \"|\".join([r\"\"\"\\S+\"\"\", r\"\\s+\"])\n");
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const std::string text = "Hello world, hello there.";
    auto ids = (*loaded)->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(Decode(**loaded, *ids), text);
    EXPECT_NE(*ids, *builtin.Encode(text));
  }
  {  // A file without pat_str is an error, not a silent fallback.
    const std::string dir = FixtureCopy("tok_bad_py");
    WriteFile(dir + "/tokenization_kimi.py", "import tiktoken\n");
    auto loaded = LoadTokenizer(dir, kFixtureVocab);
    ASSERT_FALSE(loaded.ok());
    EXPECT_TRUE(Contains(std::string(loaded.status().message()), "tokenization_kimi.py"));
  }
}

// ---------------------------------------------------------------------------
// Byte-pair merging

TEST(BytePairMergeTest, HeapMatchesTiktokensQuadraticMerge) {
  const BpeRanks& ranks = FixtureRanks().ranks;
  std::mt19937_64 gen(7);
  // Pieces from bytes that merge a lot (the fixture learned " the", "ll",
  // digits, CJK prefixes), plus arbitrary bytes.
  const std::string alphabet = " theloaHWrd123\xE4\xBD\xA0\xE5\xA5\xBD\n\t'";
  for (int trial = 0; trial < 400; ++trial) {
    const size_t length = 1 + gen() % (trial < 200 ? 40 : 700);
    std::string piece;
    for (size_t i = 0; i < length; ++i) {
      piece += gen() % 8 == 0 ? static_cast<char>(gen() % 256) : alphabet[gen() % alphabet.size()];
    }
    const auto quadratic = BytePairMergeQuadratic(ranks, piece);
    ASSERT_EQ(BytePairMergeHeap(ranks, piece), quadratic) << trial;
    ASSERT_EQ(quadratic.front(), 0u);
    ASSERT_EQ(quadratic.back(), piece.size());
  }
}

TEST(BytePairMergeTest, LowestRankFirstLeftmostOnTies) {
  // Ranks: a b c, "ab" < "bc"; "aa" for ties.
  const std::vector<std::string> tokens = {"a", "b", "c", "bc", "ab", "aa", "abc"};
  BpeRanks ranks;
  for (size_t i = 0; i < tokens.size(); ++i) ranks.emplace(tokens[i], static_cast<int32_t>(i));
  // "abc": bc (3) merges before ab (4); then a+bc is "abc" (6).
  EXPECT_EQ(BytePairMergeQuadratic(ranks, "abc"), (std::vector<size_t>{0, 3}));
  // "aaa": the leftmost "aa" wins the tie.
  EXPECT_EQ(BytePairMergeQuadratic(ranks, "aaa"), (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(BytePairMergeHeap(ranks, "aaa"), (std::vector<size_t>{0, 2, 3}));
  std::vector<int32_t> ids;
  ASSERT_TRUE(BytePairEncode(ranks, "abab", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 4}));
  ids.clear();
  auto missing = BytePairEncode(ranks, "abz", &ids);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(std::string(missing.message()), "7a"));
}

// ---------------------------------------------------------------------------
// Byte tokenizer

TEST(ByteTokenizerTest, RoundTrip) {
  const std::string dir = testing::TempDir("tok_byte");
  auto loaded = LoadTokenizer(dir, 300);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tokenizer& tokenizer = **loaded;
  EXPECT_EQ(tokenizer.name(), "byte");
  EXPECT_EQ(tokenizer.vocab_size(), 300);
  EXPECT_TRUE(tokenizer.end_ids().empty());
  const std::string text = "Hi 你好 é\n<|im_end|>";
  auto ids = tokenizer.Encode(text, true);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ((*ids)[i], static_cast<uint8_t>(text[i]));
  EXPECT_EQ(Decode(tokenizer, *ids), text);
  EXPECT_EQ(*tokenizer.TokenBytes(0xFF), "\xFF");
  for (const int32_t id : {256, 299, 300, -1}) {
    auto bytes = tokenizer.TokenBytes(id);
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(bytes.status().message()), absl::StrCat("id ", id)));
  }
  auto bad = tokenizer.Encode("ab\x80");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "byte offset 2"));
}

TEST(ByteTokenizerTest, SmallVocabHasNoTokenizer) {
  const std::string dir = testing::TempDir("tok_none");
  auto loaded = LoadTokenizer(dir, 255);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(loaded.status().message()), "no tokenizer: use token ids"));
  EXPECT_TRUE(Contains(std::string(loaded.status().message()), dir));
}

// ---------------------------------------------------------------------------
// Incremental detokenization

std::vector<std::string> AddAll(IncrementalDetokenizer& detok, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (const int32_t id : ids) {
    auto text = detok.Add(id);
    EXPECT_TRUE(text.ok()) << text.status();
    out.push_back(text.ok() ? *text : "");
  }
  return out;
}

TEST(IncrementalDetokenizerTest, HoldsASplitCharacterUntilWhole) {
  ByteTokenizer bytes(256);
  IncrementalDetokenizer detok(bytes);
  // é = C3 A9, € = E2 82 AC, 😀 = F0 9F 98 80.
  EXPECT_EQ(AddAll(detok, {'a', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 'b'}),
            (std::vector<std::string>{"a", "", "é", "", "", "€", "", "", "", "😀", "b"}));
  EXPECT_EQ(detok.Finish(), "");
}

TEST(IncrementalDetokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  ByteTokenizer bytes(300);
  const std::string fffd(kReplacementCharacter);
  {
    IncrementalDetokenizer detok(bytes);
    // FF never valid; 80 has no lead; C3 then 'a' breaks the character;
    // E0 80 is overlong (E0 needs A0..BF next): two maximal subparts.
    EXPECT_EQ(AddAll(detok, {0xFF, 0x80, 0xC3, 'a', 0xE0, 0x80}),
              (std::vector<std::string>{fffd, fffd, "", fffd + "a", "", fffd + fffd}));
    EXPECT_EQ(detok.Finish(), "");
  }
  {
    IncrementalDetokenizer detok(bytes);
    // An unfinished character at the end is one U+FFFD, then a fresh start.
    EXPECT_EQ(AddAll(detok, {'x', 0xE2, 0x82}), (std::vector<std::string>{"x", "", ""}));
    EXPECT_EQ(detok.Finish(), fffd);
    EXPECT_EQ(*detok.Add('y'), "y");
    EXPECT_EQ(detok.Finish(), "");
  }
  {
    IncrementalDetokenizer detok(bytes);
    auto bad = detok.Add(256);
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(Contains(std::string(bad.status().message()), "id 256"));
  }
}

TEST(IncrementalDetokenizerTest, ReassemblesEveryFixtureString) {
  const Tokenizer& tokenizer = Fixture();
  int held = 0;  // tokens that completed no character: the fixture has some
  for (const Case& c : LoadExpected().cases) {
    SCOPED_TRACE(c.text.substr(0, 80));
    for (const auto* ids : {&c.ordinary, &c.special}) {
      IncrementalDetokenizer detok(tokenizer);
      std::string text;
      for (const std::string& piece : AddAll(detok, *ids)) {
        EXPECT_EQ(FirstInvalidUtf8(piece), std::string_view::npos);
        held += piece.empty();
        text += piece;
      }
      text += detok.Finish();
      EXPECT_EQ(text, c.text);
    }
  }
  EXPECT_GT(held, 0);
}

}  // namespace
}  // namespace deltaserve
