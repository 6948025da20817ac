#include "runtime/serving/worker_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/file_util.h"
#include "runtime/common/random_bytes.h"

namespace deltaserve {
namespace {

std::string Errno(const std::string& path, const char* what) {
  return absl::StrCat(path, ": ", what, ": ", std::strerror(errno));
}

// A directory only this user may change: owned by it, writable by no group
// or other (a file in one another user can write could be replaced or
// read through a link of theirs).
absl::Status CheckPrivateDirectory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::PermissionDeniedError(Errno(dir, "cannot inspect the directory"));
  }
  if (!S_ISDIR(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory"));
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": owned by uid ", st.st_uid, ", not by this user (uid ", ::geteuid(),
                     "): a worker token is written only into a directory of its own user"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        dir, ": mode ", absl::Hex(st.st_mode & 07777),
        " lets others write it: a worker token is written only into a directory no one else "
        "can change (chmod go-w, or 700)"));
  }
  return absl::OkStatus();
}

bool IsDirectory(const char* path) {
  struct stat st {};
  return path != nullptr && *path != '\0' && ::stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::StatusOr<std::string> NewWorkerToken() {
  unsigned char bytes[32];
  if (absl::Status ok = FillRandom(bytes, sizeof(bytes)); !ok.ok()) {
    return absl::InternalError(absl::StrCat("cannot make a worker token: ", ok.message()));
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string DefaultWorkerTokenPath(int port) {
  const std::string name = absl::StrCat("worker-token-", port);
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); IsDirectory(runtime)) {
    return absl::StrCat(runtime, "/deltaserve/", name);
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.deltaserve/", name);
  }
  return "";
}

std::optional<int> TargetPort(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  const std::string digits = target.substr(colon + 1);
  int port = 0;
  if (digits.empty() || digits.size() > 5 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &port) || port < 1 || port > 65535) {
    return std::nullopt;
  }
  return port;
}

absl::Status WriteWorkerTokenFile(const std::string& path, const std::string& token,
                                  bool make_dir) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (make_dir && !dir.empty() && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(Errno(dir, "cannot create the directory"));
  }
  if (absl::Status s = CheckPrivateDirectory(dir.empty() ? "." : dir); !s.ok()) return s;
  if (absl::Status s = CheckOutputPath(path); !s.ok()) return s;
  const std::string tmp = path + ".tmp";
  // A file left by an interrupted write is ours to replace; O_EXCL and
  // O_NOFOLLOW keep anything else there from being written through.
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return absl::PermissionDeniedError(Errno(tmp, "cannot create for writing"));
  // The mode is 600 whatever the umask said.
  const std::string line = absl::StrCat(token, "\n");
  bool ok = ::fchmod(fd, 0600) == 0;
  for (size_t done = 0; ok && done < line.size();) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = Errno(path, "cannot write the worker token");
    ::unlink(tmp.c_str());
    return absl::PermissionDeniedError(error);
  }
  return absl::OkStatus();
}

void RemoveWorkerTokenFile(const std::string& path, const std::string& token) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, 4096);
  if (text.ok() && absl::StripAsciiWhitespace(*text) == token) ::unlink(path.c_str());
}

}  // namespace deltaserve
