#include "runtime/common/file_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace deltaserve {

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat(tmp, ": cannot open for writing: ", std::strerror(errno)));
    }
    write(out);
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat(tmp, ": write failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat(path, ": cannot move the written file into place: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
