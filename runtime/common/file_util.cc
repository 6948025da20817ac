#include "runtime/common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <streambuf>
#include <vector>

#include "absl/strings/str_cat.h"

namespace deltaserve {
namespace {

std::string Errno(const std::string& path, const std::string& what) {
  return absl::StrCat(path, ": ", what, ": ", std::strerror(errno));
}

// A stream buffer writing to a file descriptor it owns, in 64 KiB pieces.
class FdStreambuf final : public std::streambuf {
 public:
  explicit FdStreambuf(int fd) : fd_(fd), buffer_(1 << 16) {
    setp(buffer_.data(), buffer_.data() + buffer_.size());
  }
  ~FdStreambuf() override {
    Flush();
    Close();
  }
  // Flushes and closes; false when a write or the close failed.
  bool Close() {
    if (fd_ < 0) return ok_;
    const bool flushed = Flush();
    ok_ = ::close(fd_) == 0 && flushed && ok_;
    fd_ = -1;
    return ok_;
  }

 protected:
  int_type overflow(int_type c) override {
    if (!Flush()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override { return Flush() ? 0 : -1; }

 private:
  bool Flush() {
    if (fd_ < 0) return false;
    for (char* at = pbase(); at < pptr();) {
      const ssize_t n = ::write(fd_, at, static_cast<size_t>(pptr() - at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok_ = false;
        setp(buffer_.data(), buffer_.data() + buffer_.size());
        return false;
      }
      at += n;
    }
    setp(buffer_.data(), buffer_.data() + buffer_.size());
    return true;
  }

  int fd_;
  bool ok_ = true;
  std::vector<char> buffer_;
};

// An ostream that owns its FdStreambuf.
class FdOstream final : public std::ostream {
 public:
  explicit FdOstream(int fd) : std::ostream(nullptr), buf_(fd) { rdbuf(&buf_); }
  // Flushes and closes; the stream's state says whether all went out.
  void Close() {
    if (!buf_.Close()) setstate(std::ios::badbit);
  }

 private:
  FdStreambuf buf_;
};

}  // namespace

const char* FileKind(mode_t mode) {
  return S_ISREG(mode)    ? "a regular file"
         : S_ISLNK(mode)  ? "a symbolic link"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "not a regular file";
}

absl::Status CheckOutputPath(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InvalidArgumentError(Errno(path, "cannot look at the output path"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", FileKind(st.st_mode),
                                                   ", not a regular file; refusing to write it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> OpenOutputFile(const std::string& path, int flags, mode_t mode) {
  if (absl::Status s = CheckOutputPath(path); !s.ok()) return s;
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": is a symbolic link, not a regular file; refusing to write it"));
    }
    return absl::PermissionDeniedError(Errno(path, "cannot open for writing"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string message = Errno(path, "cannot stat");
    ::close(fd);
    return absl::InternalError(message);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", FileKind(st.st_mode),
                                                   ", not a regular file; refusing to write it"));
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const std::string message = Errno(path, "cannot make the file blocking");
    ::close(fd);
    return absl::InternalError(message);
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<std::ostream>> OpenOutputStream(const std::string& path) {
  absl::StatusOr<int> fd = OpenOutputFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<std::ostream>(new FdOstream(*fd));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::function<void(std::ostream&)>& write) {
  if (absl::Status s = CheckOutputPath(path); !s.ok()) return s;
  const std::string tmp = path + ".tmp";
  constexpr int kTmpFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), kTmpFlags, 0644);
  if (fd < 0 && errno == EEXIST) {
    // A regular file is what an interrupted write leaves; anything else was
    // put there, and is not ours to write through or remove.
    struct stat st {};
    if (::lstat(tmp.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(tmp, ": is ", FileKind(st.st_mode),
                       ", not a regular file; refusing to write through it (remove it)"));
    }
    if (::unlink(tmp.c_str()) == 0 || errno == ENOENT) fd = ::open(tmp.c_str(), kTmpFlags, 0644);
  }
  if (fd < 0) return absl::PermissionDeniedError(Errno(tmp, "cannot create for writing"));
  {
    FdOstream out(fd);
    write(out);
    out.Close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat(tmp, ": write failed"));
    }
  }
  // Again: what was a regular file or a new name may have been replaced
  // while the content was written.
  if (absl::Status s = CheckOutputPath(path); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string message = Errno(path, "cannot move the written file into place");
    std::remove(tmp.c_str());
    return absl::DataLossError(message);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = FileKind(st.st_mode);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", kind, ", not a regular file; refusing to read it"));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", st.st_size, " bytes, over the limit of ", max_bytes, " for this file"));
  }
  // The file may grow while it is read: read at most one byte past the
  // limit, to notice.
  std::string out;
  out.resize(static_cast<size_t>(st.st_size) + 1);
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (static_cast<int64_t>(got) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": grew past the limit of ", max_bytes, " bytes while being read"));
  }
  out.resize(got);
  return out;
}

}  // namespace deltaserve
