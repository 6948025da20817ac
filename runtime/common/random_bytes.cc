#include "runtime/common/random_bytes.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deltaserve {

absl::Status FillRandom(void* out, size_t size) {
  auto* bytes = static_cast<unsigned char*>(out);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::getrandom(bytes + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("getrandom: ", n < 0 ? std::strerror(errno) : "no bytes"));
    }
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
