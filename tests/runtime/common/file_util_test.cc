// ReadRegularFile refuses what is not a small regular file, quickly and
// without blocking: a FIFO with no writer, a link to /dev/zero, a directory,
// a (sparse) file over the limit.
#include "runtime/common/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace deltaserve {
namespace {

::testing::AssertionResult Refused(const absl::StatusOr<std::string>& got,
                                   const std::string& part) {
  if (got.ok()) return ::testing::AssertionFailure() << "read " << got->size() << " bytes";
  if (std::string(got.status().message()).find(part) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << got.status() << "' lacks '" << part << "'";
  }
  return ::testing::AssertionSuccess();
}

TEST(ReadRegularFileTest, ReadsASmallFileWhole) {
  const std::string path = testing::TempDir("file_util") + "/small";
  std::ofstream(path) << "hello";
  auto got = ReadRegularFile(path, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "hello");
  EXPECT_TRUE(Refused(ReadRegularFile(path, 4), "5 bytes, over the limit of 4"));
  EXPECT_EQ(ReadRegularFile(path + ".missing", 5).status().code(), absl::StatusCode::kNotFound);
}

TEST(ReadRegularFileTest, RefusesSpecialFilesWithoutBlocking) {
  const std::string dir = testing::TempDir("file_util");
  const std::string fifo = dir + "/fifo", zero = dir + "/zero", big = dir + "/big";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::filesystem::create_symlink("/dev/zero", zero);
  {
    std::ofstream(big).put('x');
    std::filesystem::resize_file(big, int64_t{1} << 40);  // sparse: 1 TiB of nothing
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(Refused(ReadRegularFile(fifo, 1 << 20), "is a FIFO, not a regular file"));
  EXPECT_TRUE(Refused(ReadRegularFile(zero, 1 << 20), "is a character device"));
  EXPECT_TRUE(Refused(ReadRegularFile(dir, 1 << 20), "is a directory"));
  EXPECT_TRUE(Refused(ReadRegularFile(big, 1 << 20), "1099511627776 bytes, over the limit"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

}  // namespace
}  // namespace deltaserve
