// JSON from a client, a file or a peer, parsed into nlohmann::json within
// bounds: nesting (deep trees cost stack in every recursive user), and the
// number of values (a tree takes tens of times its text's size: a 64 MiB
// body of `[{},{},...]` would be gigabytes), without exceptions, and with
// errors that name the field a bad value sits at: a number out of a
// double's range (1e400), nesting past the limit. Syntax errors keep the
// parser's wording.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace deltaserve {

struct JsonLimits {
  int max_depth = 16;             // the top level is depth 1
  int64_t max_values = -1;        // scalars, arrays and objects; -1: no limit
  std::string root = "the text";  // names the top level in errors
};

// INVALID_ARGUMENT: "not JSON: syntax error while parsing ...",
// "temperature: 1e400: a number out of the range of a double",
// "questions[1]: nested deeper than the limit of 16 levels",
// "the body: more than N values, the limit".
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, const JsonLimits& limits);

}  // namespace deltaserve
