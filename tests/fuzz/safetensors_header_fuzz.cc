// libFuzzer: any bytes as a safetensors file. Opening either fails with a
// Status or gives views that lie inside the file, which every tensor's
// conversion then reads whole (ASan checks the bounds).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An in-memory file; Open maps it through /proc like any path.
  static const int fd = ::memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::abort();
  }
  auto file = deltaserve::SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (!file.ok()) return 0;
  for (const auto& [name, view] : (*file)->tensors()) {
    // Bound the work per input: the views are checked, the copies are not
    // the point.
    if (view.nbytes > (1 << 20)) continue;
    (void)deltaserve::ToFloat64(view);
    (void)deltaserve::ToInt64(view);
  }
  return 0;
}
