// Where a coordinator writes the worker token it made: only into a
// directory of its own user that no one else can change.
#include "runtime/serving/worker_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

// A directory writable by others (a shared submit directory) was once
// written into, so another user could replace or read the token there.
TEST(WorkerTokenTest, IsWrittenOnlyIntoADirectoryNoOneElseCanChange) {
  const std::string dir = testing::TempDir("worker_token");
  const std::string token(64, 'a');
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  ASSERT_TRUE(WriteWorkerTokenFile(dir + "/token", token, false).ok());
  EXPECT_EQ(std::filesystem::status(dir + "/token").permissions(),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  for (const mode_t mode : {0777, 0775, 01777}) {
    ASSERT_EQ(::chmod(dir.c_str(), mode), 0);
    const absl::Status s = WriteWorkerTokenFile(dir + "/other", token, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << mode;
    EXPECT_NE(s.message().find("lets others write it"), std::string::npos) << s;
    EXPECT_NE(s.message().find(dir), std::string::npos) << s;
    EXPECT_FALSE(std::filesystem::exists(dir + "/other"));
  }
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  EXPECT_TRUE(WriteWorkerTokenFile(dir + "/other", token, false).ok());
  // Made when missing: mode 700.
  const std::string made = dir + "/made";
  ASSERT_TRUE(WriteWorkerTokenFile(made + "/token", token, true).ok());
  struct stat st {};
  ASSERT_EQ(::stat(made.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // Another user's directory (root makes one for uid 65534).
  if (::geteuid() == 0) {
    const std::string theirs = dir + "/theirs";
    ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    const absl::Status s = WriteWorkerTokenFile(theirs + "/token", token, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("owned by uid 65534"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace deltaserve
