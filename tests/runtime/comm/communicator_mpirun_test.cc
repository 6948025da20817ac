// The MPI communicator inside a real MPI job: run as `mpirun -np 4` (ctest
// does), every rank runs every test. Data checks use EXPECT so that a wrong
// value on one rank does not make it skip a collective the others are in; a
// watchdog ends the job if a test still runs after kTestTimeout, so a hang
// fails in seconds instead of blocking until ctest's timeout.
//
// Three tests only run when mpi_launch_mpi_test starts this binary for them
// (environment variables below): AbortMpi ending the job, the watchdog ending
// a hung job, and the singleton fallback check when the binary is started
// without mpirun.
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/world_layout.h"
#include "tests/runtime/comm/comm_test_util.h"
#include "tests/runtime/comm/mpi_world_env.h"

namespace deltaserve {
namespace {

using testing::HasText;

constexpr int kWorld = 4;

// 30 s per test, or DELTASERVE_TEST_WATCHDOG_S (mpi_launch_mpi_test checks the
// watchdog itself with a short one).
std::chrono::seconds TestTimeout() {
  const char* value = std::getenv("DELTASERVE_TEST_WATCHDOG_S");
  const int seconds = value != nullptr ? std::atoi(value) : 0;
  return std::chrono::seconds(seconds > 0 ? seconds : 30);
}

// --- Harness ------------------------------------------------------------------

testing::MpiWorldEnvironment* const g_world_env = testing::MpiWorldEnvironment::Register();

// Exits the process (so mpirun ends the whole job) when one test runs longer
// than TestTimeout(): the usual failure of a communication test is a hang.
class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  Watchdog() : timeout_(TestTimeout()) {}

  void OnTestProgramStart(const ::testing::UnitTest&) override {
    thread_ = std::thread([this] { Run(); });
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(mutex_);
    test_ = std::string(info.test_suite_name()) + "." + info.name();
    start_ = std::chrono::steady_clock::now();
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    test_.clear();
  }
  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(200));
      if (!test_.empty() && std::chrono::steady_clock::now() - start_ > timeout_) {
        int rank = -1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // a local query, safe from here
        std::fprintf(stderr,
                     "\nrank %d: %s still running after %lld s; exiting so that mpirun "
                     "ends the job\n",
                     rank, test_.c_str(), static_cast<long long>(timeout_.count()));
        std::fflush(stderr);
        std::_Exit(3);
      }
    }
  }

  const std::chrono::seconds timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  std::string test_;
  std::chrono::steady_clock::time_point start_;
  bool stop_ = false;
};

const bool g_watchdog_added = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new Watchdog);
  return true;
}();

// Sets `comm` to the world communicator, or fails the test (on every rank
// alike: they all made the world the same way).
#define GET_WORLD(comm)                                              \
  ASSERT_NE(g_world_env->world(), nullptr) << g_world_env->status(); \
  Communicator& comm = *g_world_env->world();                        \
  ASSERT_EQ(comm.size(), kWorld) << "run with mpirun -np " << kWorld

// Byte i of the message `tag` from `src`.
uint8_t PatternByte(int src, int tag, size_t i) {
  return static_cast<uint8_t>(src * 31 + tag * 7 + i * 13 + (i >> 9));
}
std::vector<uint8_t> Pattern(int src, int tag, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = PatternByte(src, tag, i);
  return data;
}
// The first mismatching index, or -1.
int64_t FirstMismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// --- World and layout ---------------------------------------------------------

TEST(MpiWorldTest, Identity) {
  GET_WORLD(world);
  int mpi_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  EXPECT_EQ(world.rank(), mpi_rank);
  EXPECT_EQ(world.Name(), "mpi");
  EXPECT_TRUE(LaunchedUnderMpi());
  EXPECT_TRUE(CheckNotSingletonFallback(world.size()).ok());
}

TEST(MpiWorldTest, CheckWorldAgainstTheRealWorld) {
  GET_WORLD(world);
  for (const auto& [replicas, pp, tp] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 4}, {1, 2, 2}, {1, 4, 1}, {2, 2, 1}, {2, 1, 2}, {4, 1, 1}}) {
    const WorldLayout layout = WorldLayout::Make(replicas, pp, tp).value();
    EXPECT_TRUE(layout.CheckWorld(world.size()).ok()) << layout.ToString();
  }
  const absl::Status too_big = WorldLayout::Make(1, 2, 4).value().CheckWorld(world.size());
  EXPECT_EQ(too_big.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(HasText(too_big,
                      "needs 8 processes, but the MPI world has 4: start with mpirun "
                      "-np 8"));
  EXPECT_FALSE(WorldLayout::Make(1, 1, 3).value().CheckWorld(world.size()).ok());
  EXPECT_FALSE(WorldLayout::Make(1, 1, 1).value().CheckWorld(world.size()).ok());
}

// The groups the runtime builds from a layout: TP groups (same replica and
// stage, ranked by tp_rank) and stage groups (same replica and tp_rank, ranked
// by stage).
TEST(MpiWorldTest, SplitByLayout) {
  GET_WORLD(world);
  for (const auto& [replicas, pp, tp] :
       std::vector<std::tuple<int, int, int>>{{1, 2, 2}, {2, 1, 2}, {1, 4, 1}, {1, 1, 4}}) {
    SCOPED_TRACE(::testing::Message() << replicas << "x" << pp << "x" << tp);
    const WorldLayout layout = WorldLayout::Make(replicas, pp, tp).value();
    const RankCoord me = layout.CoordOf(world.rank());
    auto tp_group = world.Split(me.replica * pp + me.stage, me.tp_rank);
    ASSERT_TRUE(tp_group.ok()) << tp_group.status();
    EXPECT_EQ((*tp_group)->size(), tp);
    EXPECT_EQ((*tp_group)->rank(), me.tp_rank);
    auto stage_group = world.Split(me.replica * tp + me.tp_rank, me.stage);
    ASSERT_TRUE(stage_group.ok()) << stage_group.status();
    EXPECT_EQ((*stage_group)->size(), pp);
    EXPECT_EQ((*stage_group)->rank(), me.stage);
    // Sum of world ranks over my TP group.
    float sum = static_cast<float>(world.rank());
    ASSERT_TRUE((*tp_group)->AllReduceSum(&sum, 1).ok());
    float want = 0.0f;
    for (int t = 0; t < tp; ++t) want += static_cast<float>(layout.Rank(me.replica, me.stage, t));
    EXPECT_EQ(sum, want);
  }
}

// --- Point to point -----------------------------------------------------------

// Each rank sends to the next and receives from the previous. Even ranks send
// first and odd ranks receive first, so blocking sends of any size cannot all
// wait on each other.
TEST(MpiPointToPointTest, RingWithTagsAndSizes) {
  GET_WORLD(world);
  const int next = (world.rank() + 1) % kWorld;
  const int prev = (world.rank() + kWorld - 1) % kWorld;
  for (const size_t bytes :
       {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65537}, (size_t{3} << 20) + 5}) {
    for (const int tag : {0, 7, 12345}) {
      SCOPED_TRACE(::testing::Message() << bytes << " bytes, tag " << tag);
      const std::vector<uint8_t> out = Pattern(world.rank(), tag, bytes);
      std::vector<uint8_t> in(bytes, 0xEE);
      if (world.rank() % 2 == 0) {
        ASSERT_TRUE(world.Send(out.data(), bytes, next, tag).ok());
        ASSERT_TRUE(world.Recv(in.data(), bytes, prev, tag).ok());
      } else {
        ASSERT_TRUE(world.Recv(in.data(), bytes, prev, tag).ok());
        ASSERT_TRUE(world.Send(out.data(), bytes, next, tag).ok());
      }
      EXPECT_EQ(FirstMismatch(in, Pattern(prev, tag, bytes)), -1);
    }
  }
}

// Messages with different tags match by tag, not arrival order.
TEST(MpiPointToPointTest, TagsMatchIndependently) {
  GET_WORLD(world);
  const int next = (world.rank() + 1) % kWorld;
  const int prev = (world.rank() + kWorld - 1) % kWorld;
  const std::vector<uint8_t> big = Pattern(world.rank(), 1, size_t{2} << 20);
  const std::vector<uint8_t> small = Pattern(world.rank(), 2, 100);
  auto first = world.Isend(big.data(), big.size(), next, 1);
  auto second = world.Isend(small.data(), small.size(), next, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  std::vector<uint8_t> got_small(small.size()), got_big(big.size());
  ASSERT_TRUE(world.Recv(got_small.data(), got_small.size(), prev, 2).ok());
  ASSERT_TRUE(world.Recv(got_big.data(), got_big.size(), prev, 1).ok());
  EXPECT_TRUE((*first)->Wait().ok());
  EXPECT_TRUE((*second)->Wait().ok());
  EXPECT_EQ(FirstMismatch(got_small, Pattern(prev, 2, small.size())), -1);
  EXPECT_EQ(FirstMismatch(got_big, Pattern(prev, 1, big.size())), -1);
}

// The pipeline pattern: Isend to the next stage, Recv from the previous, Wait.
TEST(MpiPointToPointTest, IsendThenRecvKeepsTheBufferIntact) {
  GET_WORLD(world);
  const int next = (world.rank() + 1) % kWorld;
  const int prev = (world.rank() + kWorld - 1) % kWorld;
  for (const size_t bytes : {size_t{0}, size_t{12}, (size_t{4} << 20) + 3}) {
    SCOPED_TRACE(::testing::Message() << bytes << " bytes");
    const std::vector<uint8_t> out = Pattern(world.rank(), 9, bytes);
    const std::vector<uint8_t> copy = out;
    auto request = world.Isend(out.data(), bytes, next, 9);
    ASSERT_TRUE(request.ok()) << request.status();
    std::vector<uint8_t> in(bytes, 0xEE);
    ASSERT_TRUE(world.Recv(in.data(), bytes, prev, 9).ok());
    EXPECT_TRUE((*request)->Wait().ok());
    EXPECT_TRUE((*request)->Wait().ok());  // waiting twice is harmless
    EXPECT_EQ(FirstMismatch(out, copy), -1);
    EXPECT_EQ(FirstMismatch(in, Pattern(prev, 9, bytes)), -1);
  }
}

// A request destroyed without Wait still completes (its destructor waits).
TEST(MpiPointToPointTest, UnwaitedRequestCompletesOnDestruction) {
  GET_WORLD(world);
  const int next = (world.rank() + 1) % kWorld;
  const int prev = (world.rank() + kWorld - 1) % kWorld;
  const std::vector<uint8_t> out = Pattern(world.rank(), 4, size_t{1} << 20);
  std::vector<uint8_t> in(out.size());
  {
    auto request = world.Isend(out.data(), out.size(), next, 4);
    ASSERT_TRUE(request.ok());
    ASSERT_TRUE(world.Recv(in.data(), in.size(), prev, 4).ok());
  }
  EXPECT_EQ(FirstMismatch(in, Pattern(prev, 4, in.size())), -1);
  EXPECT_TRUE(world.Barrier().ok());
}

// --- Collectives ----------------------------------------------------------------

// Integer-valued floats below 2^24: the sum is exact in any order.
TEST(MpiCollectiveTest, AllReduceSumIsExact) {
  GET_WORLD(world);
  for (const size_t count : {size_t{0}, size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    SCOPED_TRACE(::testing::Message() << count << " floats");
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) {
      data[i] = static_cast<float>(world.rank() * 1000 + static_cast<int>(i % 977)) -
                static_cast<float>(i % 3 == 0 ? 500 : 0);
    }
    ASSERT_TRUE(world.AllReduceSum(data.data(), count).ok());
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const float want = 1000.0f * (0 + 1 + 2 + 3) + 4.0f * static_cast<float>(i % 977) -
                         4.0f * static_cast<float>(i % 3 == 0 ? 500 : 0);
      if (data[i] != want && wrong++ < 5)
        ADD_FAILURE() << "element " << i << ": " << data[i] << " != " << want;
    }
    EXPECT_EQ(wrong, 0u);
  }
}

TEST(MpiCollectiveTest, BroadcastFromEveryRoot) {
  GET_WORLD(world);
  for (int root = 0; root < kWorld; ++root) {
    for (const size_t bytes : {size_t{0}, size_t{13}, (size_t{1} << 20) + 7}) {
      SCOPED_TRACE(::testing::Message() << "root " << root << ", " << bytes << " bytes");
      std::vector<uint8_t> data =
          world.rank() == root ? Pattern(root, 5, bytes) : std::vector<uint8_t>(bytes, 0xEE);
      ASSERT_TRUE(world.Broadcast(data.data(), bytes, root).ok());
      EXPECT_EQ(FirstMismatch(data, Pattern(root, 5, bytes)), -1);
    }
  }
}

TEST(MpiCollectiveTest, Barrier) {
  GET_WORLD(world);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(world.Barrier().ok());
}

// --- Split ------------------------------------------------------------------------

// TP groups of two: {0,1} and {2,3}.
TEST(MpiSplitTest, TensorParallelPairs) {
  GET_WORLD(world);
  auto pair = world.Split(world.rank() / 2, world.rank());
  ASSERT_TRUE(pair.ok()) << pair.status();
  Communicator& tp = **pair;
  EXPECT_EQ(tp.size(), 2);
  EXPECT_EQ(tp.rank(), world.rank() % 2);
  EXPECT_EQ(tp.Name(), "mpi");
  const int first = world.rank() / 2 * 2;  // world rank of the group's rank 0

  std::vector<float> x = {static_cast<float>(world.rank() + 1),
                          static_cast<float>(10 * (world.rank() + 1)), -1.0f};
  ASSERT_TRUE(tp.AllReduceSum(x.data(), x.size()).ok());
  EXPECT_EQ(x[0], static_cast<float>((first + 1) + (first + 2)));
  EXPECT_EQ(x[1], static_cast<float>(10 * ((first + 1) + (first + 2))));
  EXPECT_EQ(x[2], -2.0f);

  std::vector<uint8_t> plan =
      tp.rank() == 1 ? Pattern(first + 1, 3, 1000) : std::vector<uint8_t>(1000, 0);
  ASSERT_TRUE(tp.Broadcast(plan.data(), plan.size(), 1).ok());
  EXPECT_EQ(FirstMismatch(plan, Pattern(first + 1, 3, 1000)), -1);

  // Point to point inside the group uses group ranks.
  std::vector<uint8_t> in(300);
  if (tp.rank() == 0) {
    const std::vector<uint8_t> out = Pattern(world.rank(), 8, 300);
    ASSERT_TRUE(tp.Send(out.data(), out.size(), 1, 8).ok());
  } else {
    ASSERT_TRUE(tp.Recv(in.data(), in.size(), 0, 8).ok());
    EXPECT_EQ(FirstMismatch(in, Pattern(first, 8, 300)), -1);
  }
  EXPECT_TRUE(tp.Barrier().ok());
}

// Stage pairs: {0,2} and {1,3}.
TEST(MpiSplitTest, PipelinePairs) {
  GET_WORLD(world);
  auto pair = world.Split(world.rank() % 2, world.rank());
  ASSERT_TRUE(pair.ok()) << pair.status();
  Communicator& pp = **pair;
  EXPECT_EQ(pp.size(), 2);
  EXPECT_EQ(pp.rank(), world.rank() / 2);
  float x = static_cast<float>(world.rank() * world.rank());
  ASSERT_TRUE(pp.AllReduceSum(&x, 1).ok());
  EXPECT_EQ(x, world.rank() % 2 == 0 ? 0.0f + 4.0f : 1.0f + 9.0f);
  // Stage 0 sends its activation to stage 1.
  std::vector<uint8_t> h(4096);
  if (pp.rank() == 0) {
    const std::vector<uint8_t> out = Pattern(world.rank(), 0, h.size());
    ASSERT_TRUE(pp.Send(out.data(), out.size(), 1, 0).ok());
  } else {
    ASSERT_TRUE(pp.Recv(h.data(), h.size(), 0, 0).ok());
    EXPECT_EQ(FirstMismatch(h, Pattern(world.rank() - 2, 0, h.size())), -1);
  }
}

TEST(MpiSplitTest, KeyOrdersRanks) {
  GET_WORLD(world);
  auto reversed = world.Split(0, -world.rank());
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_EQ((*reversed)->size(), kWorld);
  EXPECT_EQ((*reversed)->rank(), kWorld - 1 - world.rank());
  // Equal keys keep the parent's order.
  auto same = world.Split(0, 0);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->rank(), world.rank());
}

TEST(MpiSplitTest, NestedSplit) {
  GET_WORLD(world);
  auto half = world.Split(world.rank() / 2, 0);
  ASSERT_TRUE(half.ok()) << half.status();
  auto single = (*half)->Split((*half)->rank(), 0);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ((*single)->size(), 1);
  EXPECT_EQ((*single)->rank(), 0);
  float x = 5.0f;
  ASSERT_TRUE((*single)->AllReduceSum(&x, 1).ok());
  EXPECT_EQ(x, 5.0f);
  // Sending to self through MPI works with a non-blocking send.
  const int value = 1234 + world.rank();
  auto request = (*single)->Isend(&value, sizeof(value), 0, 1);
  ASSERT_TRUE(request.ok());
  int got = 0;
  ASSERT_TRUE((*single)->Recv(&got, sizeof(got), 0, 1).ok());
  EXPECT_TRUE((*request)->Wait().ok());
  EXPECT_EQ(got, value);
}

// A bad color on one rank is that rank's error; the others still get their
// communicator (nobody hangs in the collective).
TEST(MpiSplitTest, NegativeColorIsAnErrorWithoutHangingOthers) {
  GET_WORLD(world);
  const bool bad = world.rank() == kWorld - 1;
  auto part = world.Split(bad ? -1 : 0, 0);
  if (bad) {
    EXPECT_EQ(part.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasText(part.status(), "mpi Split (color -1, key 0)"));
    EXPECT_TRUE(HasText(part.status(), "colors must be >= 0"));
  } else {
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_EQ((*part)->size(), kWorld - 1);
    float x = 1.0f;
    ASSERT_TRUE((*part)->AllReduceSum(&x, 1).ok());
    EXPECT_EQ(x, static_cast<float>(kWorld - 1));
  }
  EXPECT_TRUE(world.Barrier().ok());
}

// --- Errors ---------------------------------------------------------------------

TEST(MpiErrorTest, BadPeersAndTagsAreStatusesNamingThem) {
  GET_WORLD(world);
  char byte = 0;
  absl::Status status = world.Recv(&byte, 1, kWorld, 7);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(status, "mpi Recv from rank 4 (tag 7) failed"));
  EXPECT_TRUE(HasText(status, "out of range"));
  status = world.Send(&byte, 1, -1, 0);
  EXPECT_TRUE(HasText(status, "mpi Send to rank -1 (tag 0) failed"));
  const auto request = world.Isend(&byte, 1, 99, 2);
  EXPECT_TRUE(HasText(request.status(), "mpi Isend to rank 99 (tag 2) failed"));
  status = world.Send(&byte, 1, 0, -3);
  EXPECT_TRUE(HasText(status, "mpi Send to rank 0 (tag -3) failed: tag must be in 0.."));
  status = world.Recv(nullptr, 8, 0, 0);
  EXPECT_TRUE(HasText(status, "null buffer for 8 bytes"));
  // Every rank passes the same bad root, so no rank enters the collective.
  status = world.Broadcast(&byte, 1, kWorld);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(status, "mpi Broadcast of 1 bytes from root rank 4 failed"));
  EXPECT_FALSE(world.AllReduceSum(nullptr, 2).ok());
  // Nothing was sent or posted: the world still works.
  EXPECT_TRUE(world.Barrier().ok());
}

// Sizes that disagree are errors from MPI (a longer message: MPI_ERR_TRUNCATE)
// or from the received count (a shorter one), not aborts.
TEST(MpiErrorTest, SizeMismatchIsAStatus) {
  GET_WORLD(world);
  const bool even = world.rank() % 2 == 0;
  const int partner = even ? world.rank() + 1 : world.rank() - 1;
  std::vector<uint8_t> buffer(8, 1);
  if (even) {
    ASSERT_TRUE(world.Send(buffer.data(), 8, partner, 3).ok());
    const absl::Status shorter = world.Recv(buffer.data(), 8, partner, 4);
    EXPECT_EQ(shorter.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasText(shorter, "mpi Recv from rank " + std::to_string(partner) + " (tag 4)"));
    EXPECT_TRUE(HasText(shorter, "received 4 bytes, expected 8"));
  } else {
    const absl::Status longer = world.Recv(buffer.data(), 4, partner, 3);
    EXPECT_EQ(longer.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        HasText(longer, "mpi Recv from rank " + std::to_string(partner) + " (tag 3) failed"));
    EXPECT_TRUE(HasText(longer, "MPI_ERR_TRUNCATE"));
    ASSERT_TRUE(world.Send(buffer.data(), 4, partner, 4).ok());
  }
  EXPECT_TRUE(world.Barrier().ok());
}

// On a split communicator a message names the peer's world rank too.
TEST(MpiErrorTest, SplitCommunicatorErrorsNameWorldRanks) {
  GET_WORLD(world);
  auto pair = world.Split(world.rank() % 2, world.rank());  // {0,2}, {1,3}
  ASSERT_TRUE(pair.ok()) << pair.status();
  Communicator& pp = **pair;
  std::vector<uint8_t> buffer(8, 1);
  if (pp.rank() == 0) {
    ASSERT_TRUE(pp.Send(buffer.data(), 8, 1, 3).ok());
  } else {
    const absl::Status status = pp.Recv(buffer.data(), 4, 0, 3);
    const int peer_world_rank = world.rank() - 2;
    EXPECT_TRUE(HasText(status, "mpi Recv from rank 0 (world rank " +
                                    std::to_string(peer_world_rank) + ", tag 3) failed"));
  }
  const absl::Status bad = pp.Recv(buffer.data(), 1, 2, 0);
  EXPECT_TRUE(HasText(bad,
                      "mpi Recv from rank 2 (tag 0) failed: rank 2 is out of range: this "
                      "communicator has ranks 0..1"));
  EXPECT_TRUE(pp.Barrier().ok());
}

// --- Run only by mpi_launch_mpi_test ---------------------------------------------

// Rank 1 aborts while the others wait for a message from it that never comes:
// the job must end (with rank 1's code) instead of hanging.
TEST(MpiAbortTest, AbortEndsTheWholeJob) {
  if (std::getenv("DELTASERVE_TEST_MPI_ABORT") == nullptr) {
    GTEST_SKIP() << "run by mpi_launch_mpi_test";
  }
  GET_WORLD(world);
  ASSERT_TRUE(world.Barrier().ok());
  if (world.rank() == 1) AbortMpi(7);
  char byte = 0;
  const absl::Status status = world.Recv(&byte, 1, 1, 0);
  ADD_FAILURE() << "Recv from the aborted rank returned: " << status;
}

// Every rank waits for a message nobody sends: the watchdog must end the job.
TEST(MpiWatchdogTest, HangIsCaught) {
  if (std::getenv("DELTASERVE_TEST_HANG") == nullptr) GTEST_SKIP() << "run by mpi_launch_mpi_test";
  GET_WORLD(world);
  char byte = 0;
  const absl::Status status = world.Recv(&byte, 1, (world.rank() + 1) % kWorld, 99);
  ADD_FAILURE() << "Recv of a message nobody sent returned: " << status;
}

// Started without mpirun but with a Slurm step of 4 tasks in the environment:
// InitMpiWorld must refuse the singleton world.
TEST(MpiWorldTest, SingletonFallbackIsRejected) {
  if (std::getenv("DELTASERVE_TEST_EXPECT_SINGLETON_FALLBACK") == nullptr) {
    GTEST_SKIP() << "run by mpi_launch_mpi_test";
  }
  const absl::Status& status = g_world_env->status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(HasText(status, "fell back to singletons"));
  EXPECT_TRUE(HasText(status, "SLURM_STEP_NUM_TASKS=4"));
}

}  // namespace
}  // namespace deltaserve
