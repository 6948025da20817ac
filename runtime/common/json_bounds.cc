#include "runtime/common/json_bounds.h"

#include "absl/strings/str_cat.h"

namespace deltaserve {

absl::Status CheckJsonBounds(std::string_view text, int64_t max_bytes, int max_depth,
                             const std::string& what) {
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", text.size(), " bytes of JSON, over the limit of ", max_bytes));
  }
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(what,
                                                       ": JSON nested deeper than the limit of ",
                                                       max_depth, " levels (at byte ", i, ")"));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
