// Writing output files without harm to what is at their path, and so that
// readers never see a partial one (the content goes to a temporary file
// beside the target, renamed into place only when complete); reading small
// input files that may be hostile.
//
// An output path is written only when nothing is there yet or a regular
// file is: a symbolic link (even to a regular file), a FIFO, a device, a
// socket or a directory is refused with an error naming the path and what
// it is, and is neither followed nor replaced. Every file that deltaserve
// writes on a user's behalf goes through these functions.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deltaserve {

// What `mode` (st_mode) is, for messages: "a regular file", "a symbolic
// link", "a FIFO", "a character device", ...
const char* FileKind(mode_t mode);

// OK when nothing is at `path` (a new name) or a regular file is. Looks with
// lstat, so a link is seen as a link. InvalidArgument "PATH: is a FIFO, not
// a regular file; refusing to write it" otherwise; another lstat failure
// than "no such file" is an error too (naming the path and errno).
absl::Status CheckOutputPath(const std::string& path);

// Opens `path` for writing with open(2) `flags` (O_CREAT, O_TRUNC, O_APPEND,
// O_EXCL as the caller needs) and `mode`, as an output: CheckOutputPath
// first, then open with O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC added
// (a link put there in between is not followed, a FIFO not waited on), and
// what was opened is checked with fstat: anything but a regular file is
// closed and refused. The descriptor returned is blocking; the caller closes
// it.
absl::StatusOr<int> OpenOutputFile(const std::string& path, int flags, mode_t mode);

// A stream to `path`, created or emptied, opened with OpenOutputFile (for
// logs written as a program runs). Write errors show in the stream's state.
absl::StatusOr<std::unique_ptr<std::ostream>> OpenOutputStream(const std::string& path);

// Calls write(out) on a stream to `path`.tmp, then renames it to `path`.
// `path` must pass CheckOutputPath (before the write and again just before
// the rename). `path`.tmp is created with O_EXCL | O_NOFOLLOW: a regular file
// left there by an interrupted write is removed first; anything else there
// (a symbolic link, a FIFO) is refused, never written through. On any
// failure the temporary file is removed and the error names the file.
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
