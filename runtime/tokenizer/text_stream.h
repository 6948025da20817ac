// Generated text as it streams: token ids become whole characters
// (IncrementalDetokenizer) and stop strings end the text. Shared by the
// coordinator's streams and `deltaserve generate`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {

// Stop strings over text that arrives in pieces. The earliest complete stop
// string ends the text: neither it nor anything after it is emitted. A tail
// that may still grow into a stop string is held back until it cannot (or
// the text ends), so emitted text never has to be taken back.
class StopStrings {
 public:
  // Empty strings are ignored.
  explicit StopStrings(std::vector<std::string> stops);

  struct Output {
    std::string text;                 // to emit now
    std::optional<std::string> stop;  // the stop string that ended the text
  };
  // Appends `text`; `last`: nothing follows, so nothing is held back.
  Output Add(std::string_view text, bool last);

 private:
  std::vector<std::string> stops_;
  std::string held_;  // received, not yet emitted
  bool stopped_ = false;
};

// Tokens to streamed text with stop strings; one per stream.
class TextStream {
 public:
  // The tokenizer must outlive the stream.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
      : detokenizer_(tokenizer), stops_(std::move(stops)) {}

  // The text `token` completes (bytes that are not UTF-8 become U+FFFD);
  // `last`: the stream ends with this token, so held text is flushed.
  StopStrings::Output Add(int32_t token, bool last);

 private:
  IncrementalDetokenizer detokenizer_;
  StopStrings stops_;
};

}  // namespace deltaserve
