// The time left that `deltaserve batch` shows: the work left at the rate of
// the work done, where a request's work is the bytes of its input line.
#include "launcher/batch_progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace deltaserve {
namespace {

std::string EtaOf(const std::string& line) {
  const size_t at = line.find(", ETA ");
  if (at == std::string::npos) return "";
  const size_t from = at + 6;
  return line.substr(from, line.find_first_of(";,", from) - from);
}

// Three short requests done in 3 s, and a long document left that is 30
// times their size: 90 s to go at their rate, not the 1 s that counting
// requests (three done, one left) would say.
TEST(BatchProgressTest, TheTimeLeftIsTheWorkLeftAtTheRateOfTheWorkDone) {
  BatchProgress progress(/*quiet=*/true, /*interval_s=*/1);
  progress.SetTotal(4, 3 * 100 + 9000);
  for (int i = 0; i < 3; ++i) progress.RequestDone(100);
  const auto now = progress.start() + std::chrono::seconds(3);
  const std::string line = progress.Line(now);
  EXPECT_NE(line.find("batch: 3/4 requests"), std::string::npos) << line;
  EXPECT_EQ(EtaOf(line), "1m30s") << line;
}

// Requests complete from before (a resumed job) are neither work done by
// this run nor work left.
TEST(BatchProgressTest, RequestsFromBeforeAreNeitherDoneNorLeft) {
  BatchProgress progress(/*quiet=*/true, /*interval_s=*/1);
  progress.SetTotal(3, 1000 + 100 + 200);
  progress.RequestSkipped(1000);
  progress.RequestDone(100);
  const std::string line = progress.Line(progress.start() + std::chrono::seconds(10));
  EXPECT_NE(line.find("batch: 2/3 requests (1 from before)"), std::string::npos) << line;
  EXPECT_EQ(EtaOf(line), "20s") << line;
  // Nothing done yet by this run: no rate, so no time left is promised.
  BatchProgress fresh(/*quiet=*/true, /*interval_s=*/1);
  fresh.SetTotal(2, 200);
  fresh.RequestSkipped(100);
  EXPECT_EQ(EtaOf(fresh.Line(fresh.start() + std::chrono::seconds(5))), "");
}

}  // namespace
}  // namespace deltaserve
