// ReadRegularFile refuses what is not a small regular file, quickly and
// without blocking: a FIFO with no writer, a link to /dev/zero, a directory,
// a (sparse) file over the limit. The output functions write a new name or a
// regular file and refuse, leaving it as it was, a symbolic link (to a file
// or to a device), a FIFO, a device node or a directory, at the path or at
// the temporary name beside it.
#include "runtime/common/file_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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

::testing::AssertionResult Refused(const absl::Status& got, const std::string& part) {
  if (got.ok()) return ::testing::AssertionFailure() << "not refused";
  if (std::string(got.message()).find(part) == std::string::npos) {
    return ::testing::AssertionFailure() << "'" << got << "' lacks '" << part << "'";
  }
  return ::testing::AssertionSuccess();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  return WriteFileAtomically(path, [&](std::ostream& out) { out << text; });
}

// What is at `path`, without following a link.
mode_t KindAt(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mode & S_IFMT : 0;
}

TEST(WriteFileAtomicallyTest, WritesANewNameAndReplacesARegularFile) {
  const std::string dir = testing::TempDir("file_util_write");
  const std::string path = dir + "/out";
  ASSERT_TRUE(WriteText(path, "first").ok());
  EXPECT_EQ(Slurp(path), "first");
  ASSERT_TRUE(WriteText(path, "second").ok());
  EXPECT_EQ(Slurp(path), "second");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // A regular file left at the temporary name by an interrupted write.
  std::ofstream(path + ".tmp") << "left over";
  ASSERT_TRUE(WriteText(path, "third").ok());
  EXPECT_EQ(Slurp(path), "third");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(WriteFileAtomicallyTest, RefusesLinksFifosDevicesAndDirectoriesLeavingThemAsTheyWere) {
  const std::string dir = testing::TempDir("file_util_refuse");
  const std::string victim = dir + "/victim", link = dir + "/link", fifo = dir + "/fifo",
                    device = dir + "/null", sub = dir + "/sub";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, link);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::filesystem::create_directory(sub);
  // A character device of our own (/dev/null's numbers), so that a failure
  // of this test replaces nothing of the system's.
  const bool have_device = ::mknod(device.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0;

  EXPECT_TRUE(Refused(WriteText(link, "x"), link + ": is a symbolic link, not a regular file"));
  EXPECT_EQ(KindAt(link), S_IFLNK);
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_TRUE(Refused(WriteText(fifo, "x"), fifo + ": is a FIFO, not a regular file"));
  EXPECT_EQ(KindAt(fifo), S_IFIFO);
  EXPECT_TRUE(Refused(WriteText(sub, "x"), sub + ": is a directory"));
  EXPECT_EQ(KindAt(sub), S_IFDIR);
  if (have_device) {
    EXPECT_TRUE(Refused(WriteText(device, "x"), device + ": is a character device"));
    EXPECT_EQ(KindAt(device), S_IFCHR);
  }
  EXPECT_TRUE(Refused(CheckOutputPath("/dev/null"), "/dev/null: is a character device"));
  EXPECT_TRUE(CheckOutputPath(dir + "/new").ok());
  EXPECT_TRUE(CheckOutputPath(victim).ok());
  // None of them left a temporary file behind.
  for (const std::string& p : {link, fifo, sub, device}) {
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(p + ".tmp"))) << p;
  }
}

TEST(WriteFileAtomicallyTest, DoesNotWriteThroughALinkAtTheTemporaryName) {
  const std::string dir = testing::TempDir("file_util_tmp_link");
  const std::string victim = dir + "/victim", path = dir + "/out";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, path + ".tmp");
  EXPECT_TRUE(Refused(WriteText(path, "x"), path + ".tmp: is a symbolic link"));
  EXPECT_EQ(Slurp(victim), "precious");
  EXPECT_EQ(KindAt(path + ".tmp"), S_IFLNK);
  EXPECT_FALSE(std::filesystem::exists(path));
  // A FIFO there is not waited on either.
  std::filesystem::remove(path + ".tmp");
  ASSERT_EQ(::mkfifo((path + ".tmp").c_str(), 0600), 0);
  EXPECT_TRUE(Refused(WriteText(path, "x"), path + ".tmp: is a FIFO"));
}

TEST(OpenOutputFileTest, OpensRegularFilesAndRefusesTheRest) {
  const std::string dir = testing::TempDir("file_util_open");
  const std::string victim = dir + "/victim", link = dir + "/link", fifo = dir + "/fifo";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, link);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<int> fd = OpenOutputFile(dir + "/new", O_WRONLY | O_CREAT | O_APPEND, 0644);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(::fcntl(*fd, F_GETFL) & O_NONBLOCK, 0);
  ::close(*fd);
  EXPECT_TRUE(
      Refused(OpenOutputFile(link, O_WRONLY | O_APPEND, 0644).status(), "is a symbolic link"));
  EXPECT_TRUE(Refused(OpenOutputFile(fifo, O_RDWR, 0644).status(), "is a FIFO"));
  EXPECT_EQ(Slurp(victim), "precious");

  absl::StatusOr<std::unique_ptr<std::ostream>> log = OpenOutputStream(dir + "/log");
  ASSERT_TRUE(log.ok()) << log.status();
  **log << "line\n";
  log->reset();
  EXPECT_EQ(Slurp(dir + "/log"), "line\n");
  EXPECT_TRUE(Refused(OpenOutputStream(link).status(), "is a symbolic link"));
  EXPECT_EQ(Slurp(victim), "precious");
}

}  // namespace
}  // namespace deltaserve
