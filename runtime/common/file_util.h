// Writing files so that readers never see a partial one (the content goes to
// a temporary file beside the target, renamed into place only when
// complete), and reading small input files that may be hostile.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deltaserve {

// Calls write(out) on a stream to `path`.tmp, then renames it to `path`. On
// any failure the temporary file is removed and the error names the file.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::function<void(std::ostream&)>& write);

// The whole of `path`, which must be a regular file (a symbolic link to one
// is followed) of at most `max_bytes`: a FIFO, a device such as /dev/zero or
// a directory is refused without blocking (the file is opened O_NONBLOCK and
// checked with fstat before any read), as is a larger file. NotFound when it
// cannot be opened; InvalidArgument naming the file and the kind or size
// otherwise.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

}  // namespace deltaserve
