// Writing files so that readers never see a partial one: the content goes to
// a temporary file beside the target, renamed into place only when complete.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace deltaserve {

// Calls write(out) on a stream to `path`.tmp, then renames it to `path`. On
// any failure the temporary file is removed and the error names the file.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::function<void(std::ostream&)>& write);

}  // namespace deltaserve
