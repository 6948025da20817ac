// The data communicators MakeRankCommunicators builds over MPI, inside a real
// MPI job: ctest runs it as `mpirun -np 4` and `-np 2`, every rank runs every
// test. Data checks use EXPECT so that a wrong value on one rank does not make
// it skip a collective the others are in; an alarm ends the job if it hangs.
// The control communicator's own contract is communicator_mpirun_test.cc's.
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/stream.h"
#include "runtime/comm/data_communicator.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/rank_communicators.h"
#include "runtime/comm/world_layout.h"
#include "tests/runtime/comm/comm_test_util.h"
#include "tests/runtime/comm/mpi_world_env.h"

namespace deltaserve {
namespace {

using testing::HasText;

const kernels::Stream kCpu = kernels::Stream::Cpu();

// A hang ends the job (SIGALRM) instead of waiting for ctest.
testing::MpiWorldEnvironment* const g_world_env = testing::MpiWorldEnvironment::Register(120);

#define GET_WORLD(comm)                                              \
  ASSERT_NE(g_world_env->world(), nullptr) << g_world_env->status(); \
  Communicator& comm = *g_world_env->world();                        \
  ASSERT_TRUE(comm.size() == 2 || comm.size() == 4) << "run with mpirun -np 2 or 4"

// A rank's communicators for `layout`, over a fresh duplicate of the world as
// the control communicator (MakeRankCommunicators takes ownership of it).
absl::StatusOr<RankCommunicators> Make(Communicator& world, const WorldLayout& layout) {
  absl::StatusOr<std::unique_ptr<Communicator>> control = world.Split(0, world.rank());
  if (!control.ok()) return control.status();
  return MakeRankCommunicators(layout, std::move(*control));
}

// Every replicas x pp x tp layout of `world_size` ranks.
std::vector<WorldLayout> LayoutsOf(int world_size) {
  std::vector<WorldLayout> layouts;
  for (int replicas = 1; replicas <= world_size; ++replicas) {
    for (int pp = 1; replicas * pp <= world_size; ++pp) {
      if (world_size % (replicas * pp) != 0) continue;
      layouts.push_back(*WorldLayout::Make(replicas, pp, world_size / (replicas * pp)));
    }
  }
  return layouts;
}

// The packet stage `stage` of (replica, tp_rank) sends on: distinct per sender.
std::vector<float> Packet(int replica, int stage, int tp_rank, size_t floats) {
  std::vector<float> packet(floats);
  for (size_t i = 0; i < floats; ++i) {
    packet[i] = static_cast<float>(replica * 1000 + stage * 100 + tp_rank * 10) +
                static_cast<float>(i % 97) / 8;
  }
  return packet;
}

// The groups follow the layout, activations go down the stage chain as
// StageRunner sends them (Isend on, Recv from the previous stage), and the TP
// sums are exact (small integers).
TEST(DataCommunicatorMpiTest, GroupsChainAndSumsFollowTheLayout) {
  GET_WORLD(world);
  for (const WorldLayout& layout : LayoutsOf(world.size())) {
    SCOPED_TRACE(layout.ToString());
    auto comms = Make(world, layout);
    ASSERT_TRUE(comms.ok()) << comms.status();
    const RankCoord me = layout.CoordOf(world.rank());
    EXPECT_EQ(comms->control->rank(), world.rank());
    EXPECT_EQ(comms->control->size(), world.size());
    DataCommunicator& stage = *comms->stage;
    DataCommunicator& tp = *comms->tp;
    EXPECT_EQ(stage.Name(), "mpi");
    EXPECT_EQ(tp.Name(), "mpi");
    EXPECT_EQ(stage.device(), kernels::Device::kCpu);
    EXPECT_EQ(stage.size(), layout.pp);
    EXPECT_EQ(stage.rank(), me.stage);
    EXPECT_EQ(tp.size(), layout.tp);
    EXPECT_EQ(tp.rank(), me.tp_rank);

    constexpr size_t kFloats = 3001;
    std::unique_ptr<SendRequest> request;
    const std::vector<float> sent = Packet(me.replica, me.stage, me.tp_rank, kFloats);
    if (me.stage + 1 < layout.pp) {
      auto isend = stage.Isend(sent.data(), sent.size() * sizeof(float), me.stage + 1, 1, kCpu);
      ASSERT_TRUE(isend.ok()) << isend.status();
      request = std::move(*isend);
    }
    if (me.stage > 0) {
      std::vector<float> got(kFloats, -1.0f);
      ASSERT_TRUE(stage.Recv(got.data(), got.size() * sizeof(float), me.stage - 1, 1, kCpu).ok());
      EXPECT_EQ(got, Packet(me.replica, me.stage - 1, me.tp_rank, kFloats));
    }
    if (request != nullptr) {
      EXPECT_TRUE(request->Wait().ok());
    }

    std::vector<float> sum(5, static_cast<float>(world.rank()));
    ASSERT_TRUE(tp.AllReduceSum(sum.data(), sum.size(), kCpu).ok());
    float want = 0;
    for (int t = 0; t < layout.tp; ++t) {
      want += static_cast<float>(layout.Rank(me.replica, me.stage, t));
    }
    EXPECT_EQ(sum, std::vector<float>(5, want));
    EXPECT_TRUE(stage.Synchronize(kCpu).ok());
    EXPECT_TRUE(tp.Synchronize(kCpu).ok());
  }
}

// A control message and a data message between the same two ranks, with the
// same tag and size: each is received only by its own communicator. The
// control one is sent first, so were they one message space the data Recv
// would take it.
TEST(DataCommunicatorMpiTest, ControlAndDataMessagesDoNotMatch) {
  GET_WORLD(world);
  // Stage ranks are world ranks in 1 x n x 1, TP ranks in 1 x 1 x n.
  for (const auto& [pp, tp] :
       std::vector<std::tuple<int, int>>{{world.size(), 1}, {1, world.size()}}) {
    const WorldLayout layout = *WorldLayout::Make(1, pp, tp);
    SCOPED_TRACE(layout.ToString());
    auto comms = Make(world, layout);
    ASSERT_TRUE(comms.ok()) << comms.status();
    Communicator& control = *comms->control;
    DataCommunicator& data = pp > 1 ? *comms->stage : *comms->tp;
    ASSERT_EQ(data.rank(), control.rank());
    constexpr int kTag = 1;
    const uint64_t control_word = 0xC0C0C0C0u, data_word = 0xDADADADAu;
    if (control.rank() == 0) {
      auto first = control.Isend(&control_word, sizeof(control_word), 1, kTag);
      ASSERT_TRUE(first.ok()) << first.status();
      auto second = data.Isend(&data_word, sizeof(data_word), 1, kTag, kCpu);
      ASSERT_TRUE(second.ok()) << second.status();
      EXPECT_TRUE((*first)->Wait().ok());
      EXPECT_TRUE((*second)->Wait().ok());
    } else if (control.rank() == 1) {
      uint64_t got = 0;
      ASSERT_TRUE(data.Recv(&got, sizeof(got), 0, kTag, kCpu).ok());
      EXPECT_EQ(got, data_word);
      ASSERT_TRUE(control.Recv(&got, sizeof(got), 0, kTag).ok());
      EXPECT_EQ(got, control_word);
    }
    EXPECT_TRUE(control.Barrier().ok());
  }
}

// Argument errors are found before any communication and keep the MPI
// communicator's wording, world ranks included where they differ.
TEST(DataCommunicatorMpiTest, ErrorsNameTheOperationAndPeer) {
  GET_WORLD(world);
  const int n = world.size();
  auto comms = Make(world, *WorldLayout::Make(1, n, 1));
  ASSERT_TRUE(comms.ok()) << comms.status();
  DataCommunicator& stage = *comms->stage;
  std::vector<uint8_t> buffer(8);
  const absl::Status out_of_range = stage.Recv(buffer.data(), buffer.size(), n, 7, kCpu);
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(out_of_range, absl::StrCat("mpi Recv from rank ", n, " (tag 7) failed: rank ",
                                                 n, " is out of range")));
  const absl::Status cuda = stage.Send(buffer.data(), buffer.size(), (stage.rank() + 1) % n, 7,
                                       kernels::Stream::Cuda(nullptr));
  EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasText(cuda, absl::StrCat("mpi Send to rank ", (stage.rank() + 1) % n,
                                         " (tag 7) failed: the stream is on cuda")));
  EXPECT_FALSE(stage.Synchronize(kernels::Stream::Cuda(nullptr)).ok());
  if (n == 4) {
    // 1 x 2 x 2: TP rank 1's stage chain is world ranks {1, 3}.
    auto split = Make(world, *WorldLayout::Make(1, 2, 2));
    ASSERT_TRUE(split.ok()) << split.status();
    if (world.rank() == 1) {
      const absl::Status null_buffer = split->stage->Send(nullptr, 8, 1, 7, kCpu);
      EXPECT_TRUE(HasText(null_buffer,
                          "mpi Send to rank 1 (world rank 3, tag 7) failed: null buffer for 8 "
                          "bytes"));
    }
  }
  EXPECT_TRUE(world.Barrier().ok());
}

}  // namespace
}  // namespace deltaserve
