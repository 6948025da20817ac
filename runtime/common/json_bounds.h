// Bounds on JSON text from a file or a peer, checked before it is parsed: a
// parsed JSON tree takes tens of times the text's size, and deep nesting
// costs stack in the parser and the tree's users. The check is one linear
// scan that needs no parser, so it runs on any bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace deltaserve {

// OK when `text` has at most `max_bytes` bytes and no array or object nested
// deeper than `max_depth` (the top level is depth 1). Brackets inside strings
// do not count; malformed JSON is left to the parser. InvalidArgument naming
// `what`, the size or depth and the limit otherwise.
absl::Status CheckJsonBounds(std::string_view text, int64_t max_bytes, int max_depth,
                             const std::string& what);

}  // namespace deltaserve
