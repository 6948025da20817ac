#include "runtime/comm/single_communicator.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/runtime/comm/comm_test_util.h"

namespace deltaserve {
namespace {

using testing::HasText;

std::vector<uint8_t> Pattern(size_t bytes, int seed) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 7 + seed * 31);
  return data;
}

TEST(SingleCommunicatorTest, Identity) {
  SingleCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.Name(), "single");
}

TEST(SingleCommunicatorTest, SendToSelfThenRecvInOrderPerTag) {
  SingleCommunicator comm;
  const std::vector<uint8_t> a = Pattern(100, 1), b = Pattern(3 << 20, 2), c = Pattern(5, 3);
  ASSERT_TRUE(comm.Send(a.data(), a.size(), 0, 7).ok());
  ASSERT_TRUE(comm.Send(b.data(), b.size(), 0, 9).ok());
  ASSERT_TRUE(comm.Send(c.data(), c.size(), 0, 7).ok());
  EXPECT_EQ(comm.PendingMessages(), 3u);
  // Tag 9 first: tags are independent queues.
  std::vector<uint8_t> got(b.size());
  ASSERT_TRUE(comm.Recv(got.data(), got.size(), 0, 9).ok());
  EXPECT_EQ(got, b);
  // Tag 7 in the order sent.
  got.assign(a.size(), 0);
  ASSERT_TRUE(comm.Recv(got.data(), got.size(), 0, 7).ok());
  EXPECT_EQ(got, a);
  got.assign(c.size(), 0);
  ASSERT_TRUE(comm.Recv(got.data(), got.size(), 0, 7).ok());
  EXPECT_EQ(got, c);
  EXPECT_EQ(comm.PendingMessages(), 0u);
}

TEST(SingleCommunicatorTest, ZeroBytes) {
  SingleCommunicator comm;
  ASSERT_TRUE(comm.Send(nullptr, 0, 0, 0).ok());
  EXPECT_TRUE(comm.Recv(nullptr, 0, 0, 0).ok());
  EXPECT_EQ(comm.PendingMessages(), 0u);
}

TEST(SingleCommunicatorTest, IsendCopiesAtOnce) {
  SingleCommunicator comm;
  std::vector<uint8_t> data = Pattern(64, 4);
  const std::vector<uint8_t> sent = data;
  auto request = comm.Isend(data.data(), data.size(), 0, 1);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE((*request)->Wait().ok());
  EXPECT_TRUE((*request)->Wait().ok());    // a second Wait is harmless
  std::fill(data.begin(), data.end(), 0);  // the queued copy is unaffected
  std::vector<uint8_t> got(sent.size());
  ASSERT_TRUE(comm.Recv(got.data(), got.size(), 0, 1).ok());
  EXPECT_EQ(got, sent);
}

TEST(SingleCommunicatorTest, RecvWithNothingSentIsAnErrorNotAHang) {
  SingleCommunicator comm;
  char byte = 0;
  const absl::Status status = comm.Recv(&byte, 1, 0, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(HasText(status, "single Recv from rank 0 (tag 4) failed"));
  EXPECT_TRUE(HasText(status, "no message with this tag"));
}

TEST(SingleCommunicatorTest, SizeMismatchLeavesTheMessageQueued) {
  SingleCommunicator comm;
  const std::vector<uint8_t> a = Pattern(8, 5);
  ASSERT_TRUE(comm.Send(a.data(), a.size(), 0, 2).ok());
  std::vector<uint8_t> got(4);
  const absl::Status status = comm.Recv(got.data(), got.size(), 0, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(status, "the message has 8 bytes, the receive expects 4"));
  got.resize(8);
  ASSERT_TRUE(comm.Recv(got.data(), got.size(), 0, 2).ok());
  EXPECT_EQ(got, a);
}

TEST(SingleCommunicatorTest, BadArgumentsNameTheRankAndTag) {
  SingleCommunicator comm;
  char byte = 0;
  absl::Status status = comm.Send(&byte, 1, 1, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(status, "single Send to rank 1 (tag 0) failed: rank out of range"));
  status = comm.Recv(&byte, 1, -1, 3);
  EXPECT_TRUE(HasText(status, "single Recv from rank -1 (tag 3) failed"));
  status = comm.Send(&byte, 1, 0, -5);
  EXPECT_TRUE(HasText(status, "tags must be >= 0"));
  status = comm.Send(nullptr, 4, 0, 0);
  EXPECT_TRUE(HasText(status, "null buffer for 4 bytes"));
  EXPECT_FALSE(comm.Isend(&byte, 1, 2, 0).ok());
  EXPECT_EQ(comm.PendingMessages(), 0u);
}

TEST(SingleCommunicatorTest, CollectivesAreIdentity) {
  SingleCommunicator comm;
  std::vector<float> x(1000);
  std::iota(x.begin(), x.end(), -3.0f);
  const std::vector<float> before = x;
  ASSERT_TRUE(comm.AllReduceSum(x.data(), x.size()).ok());
  EXPECT_EQ(x, before);
  ASSERT_TRUE(comm.Broadcast(x.data(), x.size() * sizeof(float), 0).ok());
  EXPECT_EQ(x, before);
  EXPECT_TRUE(comm.Barrier().ok());
  EXPECT_TRUE(comm.AllReduceSum(nullptr, 0).ok());
  EXPECT_FALSE(comm.AllReduceSum(nullptr, 3).ok());
  const absl::Status status = comm.Broadcast(x.data(), 4, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(status, "single Broadcast from root rank 1 failed"));
}

TEST(SingleCommunicatorTest, SplitGivesAnIndependentCommunicator) {
  SingleCommunicator comm;
  const char a = 'a';
  ASSERT_TRUE(comm.Send(&a, 1, 0, 0).ok());
  auto part = comm.Split(3, 0);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ((*part)->size(), 1);
  EXPECT_EQ((*part)->rank(), 0);
  EXPECT_EQ((*part)->Name(), "single");
  char got = 0;
  EXPECT_FALSE((*part)->Recv(&got, 1, 0, 0).ok());  // not the parent's queue
  ASSERT_TRUE(comm.Recv(&got, 1, 0, 0).ok());
  EXPECT_EQ(got, 'a');
  const auto bad = comm.Split(-1, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(bad.status(), "single Split (color -1, key 0) failed"));
}

TEST(SingleCommunicatorTest, UsableThroughTheInterface) {
  std::unique_ptr<Communicator> comm = std::make_unique<SingleCommunicator>();
  const int value = 42;
  ASSERT_TRUE(comm->Send(&value, sizeof(value), 0, 11).ok());
  int got = 0;
  ASSERT_TRUE(comm->Recv(&got, sizeof(got), 0, 11).ok());
  EXPECT_EQ(got, 42);
}

}  // namespace
}  // namespace deltaserve
