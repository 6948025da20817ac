#include "runtime/tokenizer/text_stream.h"

#include <algorithm>

namespace deltaserve {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStrings::Output StopStrings::Add(std::string_view text, bool last) {
  Output out;
  if (stopped_) return out;
  held_.append(text);
  // Emitted text never ends in a proper prefix of a stop string (that is
  // held back), so a match lies wholly inside what is held.
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      out.stop = s;
    }
  }
  size_t emit = held_.size();
  if (out.stop) {
    emit = best;
    stopped_ = true;
  } else if (!last) {
    for (const std::string& s : stops_) {
      for (size_t k = std::min(s.size() - 1, held_.size()); k > 0; --k) {
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          emit = std::min(emit, held_.size() - k);
          break;
        }
      }
    }
  }
  out.text = held_.substr(0, emit);
  held_.erase(0, stopped_ ? held_.size() : emit);
  return out;
}

StopStrings::Output TextStream::Add(int32_t token, bool last) {
  auto piece = detokenizer_.Add(token);
  std::string text = piece.ok() ? std::move(*piece) : std::string("\xEF\xBF\xBD");
  if (last) text += detokenizer_.Finish();
  return stops_.Add(text, last);
}

}  // namespace deltaserve
