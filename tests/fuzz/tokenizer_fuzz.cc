// libFuzzer: any bytes through the tiktoken tokenizer of tests/data/tokenizer.
// Encode fails (not UTF-8) or gives ids in the vocabulary whose bytes,
// concatenated, are the input again, as is their incremental detokenization.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "runtime/tokenizer/tokenizer.h"

namespace {

const deltaserve::Tokenizer& Fixture() {
  static const deltaserve::Tokenizer* tokenizer = [] {
    auto loaded =
        deltaserve::LoadTokenizer(std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer",
                                  /*vocab_size=*/1024);
    if (!loaded.ok()) std::abort();
    return loaded->release();
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const deltaserve::Tokenizer& tokenizer = Fixture();
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const bool special : {false, true}) {
    auto ids = tokenizer.Encode(text, special);
    if (!ids.ok()) continue;
    std::string bytes;
    for (const int32_t id : *ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
      auto piece = tokenizer.TokenBytes(id);
      if (!piece.ok()) std::abort();
      bytes += *piece;
    }
    if (bytes != text) std::abort();
    // The text was valid UTF-8, so streaming it back replaces nothing.
    deltaserve::IncrementalDetokenizer stream(tokenizer);
    std::string streamed;
    for (const int32_t id : *ids) {
      auto piece = stream.Add(id);
      if (!piece.ok()) std::abort();
      streamed += *piece;
    }
    streamed += stream.Finish();
    if (streamed != text) std::abort();
  }
  return 0;
}
