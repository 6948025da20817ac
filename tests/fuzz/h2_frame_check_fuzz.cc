// libFuzzer: any bytes as the client's side of an HTTP/2 connection through
// H2FrameCheck (runtime/serving/h2_guard.h), after the client preface when
// the first byte is odd. The same bytes given whole and cut into pieces (of
// the size the second byte picks) get the same verdict, as they do from a
// socket that delivers them in any pieces at one time (the control frame
// bucket fills with time, so pieces at other times may fare better).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/serving/h2_guard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::string bytes = (data[0] & 1) != 0 ? "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" : "";
  bytes.append(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t piece = data[1] % 23 + 1;
  deltaserve::H2Rules rules;
  rules.max_header_block_bytes = 4096;
  rules.control_frame_burst = 64;
  deltaserve::H2FrameCheck whole(rules), cut(rules);
  const auto now = std::chrono::steady_clock::now();
  const absl::Status at_once = whole.Consume(bytes, now);
  absl::Status in_pieces;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    in_pieces = cut.Consume(absl::string_view(bytes).substr(i, piece), now);
  }
  if (at_once != in_pieces) std::abort();
  return 0;
}
