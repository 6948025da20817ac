// The MPI communicator (host buffers) and the MPI entry points of mpi_runtime.h.
// Built only with MPI (DELTASERVE_HAVE_MPI 1); <mpi.h> stays in this file.
//
// Every communicator this file creates has MPI_ERRORS_RETURN set, so an MPI
// failure comes back as a return code and leaves here as a Status naming the
// operation, the peer and the MPI error string. Arguments are checked before
// any MPI call, so a bad rank or tag never reaches MPI. Messages larger than
// MPI's int count are sent as several messages of at most kMaxChunkBytes; both
// ends split them the same way, and MPI keeps messages between one pair with
// one tag in order. (DELTASERVE_TEST_MPI_CHUNK_BYTES lowers that limit for a
// whole job, so the tests cover the splitting with small messages.)
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/world_layout.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

// Well below INT_MAX, so counts fit MPI's int for bytes and for floats.
constexpr size_t kMaxChunkBytes = size_t{1} << 30;

// kMaxChunkBytes, or a smaller positive DELTASERVE_TEST_MPI_CHUNK_BYTES. Every
// rank must see the same value (mpirun -x): it decides how a message is cut.
size_t MaxChunkBytes() {
  const char* value = std::getenv("DELTASERVE_TEST_MPI_CHUNK_BYTES");
  size_t bytes = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &bytes) || bytes == 0) return kMaxChunkBytes;
  return std::min(bytes, kMaxChunkBytes);
}

// Set when InitMpiWorld called MPI_Init_thread, so FinalizeMpi finalizes only
// what it started (tests and other hosts may own the initialization).
bool g_initialized_here = false;

bool MpiIsRunning() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return absl::StrCat("MPI error code ", code);
  }
  return std::string(text, static_cast<size_t>(length));
}

absl::StatusCode StatusCodeForMpiError(int code) {
  int error_class = MPI_ERR_UNKNOWN;
  MPI_Error_class(code, &error_class);
  switch (error_class) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_COMM:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_TRUNCATE:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

// OK for MPI_SUCCESS; otherwise "<describe()> failed: <MPI error string>".
// `describe` is only called on failure, keeping the fast path free of strings.
template <typename Describe>
absl::Status MpiCheck(int rc, Describe describe) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  return absl::Status(StatusCodeForMpiError(rc),
                      absl::StrCat(describe(), " failed: ", MpiErrorString(rc)));
}

// How a message of `bytes` bytes is cut into messages of at most `max` bytes:
// at least one, so a 0-byte send still matches a 0-byte receive.
struct Chunks {
  size_t bytes;
  size_t max;
  size_t count() const { return bytes == 0 ? 1 : (bytes + max - 1) / max; }
  size_t offset(size_t chunk) const { return chunk * max; }
  int size(size_t chunk) const { return static_cast<int>(std::min(max, bytes - chunk * max)); }
};

class MpiSendRequest final : public SendRequest {
 public:
  MpiSendRequest(std::vector<MPI_Request> requests, std::string description)
      : requests_(std::move(requests)), description_(std::move(description)) {}
  ~MpiSendRequest() override {
    // After MPI_Finalize nothing can be waited for (and MPI completed it).
    if (!result_.has_value() && MpiIsRunning()) Wait().IgnoreError();
  }

  absl::Status Wait() override {
    if (result_.has_value()) return *result_;
    absl::Status status;
    for (MPI_Request& request : requests_) {
      // Every chunk is waited for, even after an error, so none is left in flight.
      absl::Status chunk = MpiCheck(MPI_Wait(&request, MPI_STATUS_IGNORE),
                                    [&] { return absl::StrCat(description_, " (Wait)"); });
      if (status.ok()) status = chunk;
    }
    result_ = status;
    return status;
  }

 private:
  std::vector<MPI_Request> requests_;
  std::string description_;  // "mpi Isend to rank 3 (tag 7)"
  std::optional<absl::Status> result_;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed here on error, or by the destructor).
  // `max_chunk_bytes` must be the same on every rank.
  static absl::StatusOr<std::unique_ptr<Communicator>> Adopt(MPI_Comm comm,
                                                             size_t max_chunk_bytes) {
    std::unique_ptr<MpiCommunicator> result(new MpiCommunicator(comm, max_chunk_bytes));
    if (absl::Status status = result->Initialize(); !status.ok()) return status;
    return result;
  }

  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_NULL && MpiIsRunning()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "mpi"; }

  absl::Status Send(const void* data, size_t bytes, int dest, int tag) override {
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint("Send", "to", data, bytes, dest, tag));
    const char* base = static_cast<const char*>(data);
    const Chunks chunks{bytes, max_chunk_bytes_};
    for (size_t chunk = 0; chunk < chunks.count(); ++chunk) {
      DELTASERVE_RETURN_IF_ERROR(MpiCheck(
          MPI_Send(base + chunks.offset(chunk), chunks.size(chunk), MPI_BYTE, dest, tag, comm_),
          [&] { return Describe("Send", "to", dest, tag); }));
    }
    return absl::OkStatus();
  }

  absl::Status Recv(void* data, size_t bytes, int src, int tag) override {
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint("Recv", "from", data, bytes, src, tag));
    char* base = static_cast<char*>(data);
    const Chunks chunks{bytes, max_chunk_bytes_};
    for (size_t chunk = 0; chunk < chunks.count(); ++chunk) {
      const int expected = chunks.size(chunk);
      MPI_Status status;
      DELTASERVE_RETURN_IF_ERROR(MpiCheck(
          MPI_Recv(base + chunks.offset(chunk), expected, MPI_BYTE, src, tag, comm_, &status),
          [&] { return Describe("Recv", "from", src, tag); }));
      // A shorter message than expected is not an MPI error; it is ours.
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      if (received != expected) {
        return absl::InvalidArgumentError(
            absl::StrCat(Describe("Recv", "from", src, tag), " failed: received ", received,
                         " bytes, expected ", expected, chunks.count() > 1 ? " in this chunk" : "",
                         ": sender and receiver disagree on the message size"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes, int dest,
                                                     int tag) override {
    DELTASERVE_RETURN_IF_ERROR(CheckPointToPoint("Isend", "to", data, bytes, dest, tag));
    const char* base = static_cast<const char*>(data);
    const Chunks chunks{bytes, max_chunk_bytes_};
    std::vector<MPI_Request> requests;
    requests.reserve(chunks.count());
    for (size_t chunk = 0; chunk < chunks.count(); ++chunk) {
      MPI_Request request = MPI_REQUEST_NULL;
      absl::Status status = MpiCheck(MPI_Isend(base + chunks.offset(chunk), chunks.size(chunk),
                                               MPI_BYTE, dest, tag, comm_, &request),
                                     [&] { return Describe("Isend", "to", dest, tag); });
      if (!status.ok()) {
        // Chunks already started still read the buffer: finish them first.
        MpiSendRequest(std::move(requests), "").Wait().IgnoreError();
        return status;
      }
      requests.push_back(request);
    }
    return std::make_unique<MpiSendRequest>(std::move(requests),
                                            Describe("Isend", "to", dest, tag));
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    auto describe = [&] {
      return absl::StrCat("mpi AllReduceSum of ", count, " floats over ", size_, " ranks",
                          WorldRankNote());
    };
    if (data == nullptr && count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: null buffer"));
    }
    const size_t max_chunk_floats = std::max<size_t>(1, max_chunk_bytes_ / sizeof(float));
    size_t done = 0;
    do {
      const size_t chunk = std::min(max_chunk_floats, count - done);
      DELTASERVE_RETURN_IF_ERROR(
          MpiCheck(MPI_Allreduce(MPI_IN_PLACE, data + done, static_cast<int>(chunk), MPI_FLOAT,
                                 MPI_SUM, comm_),
                   describe));
      done += chunk;
    } while (done < count);
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    auto describe = [&] {
      return absl::StrCat("mpi Broadcast of ", bytes, " bytes from root ", PeerName(root));
    };
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: ", OutOfRange(root)));
    }
    if (data == nullptr && bytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: null buffer"));
    }
    char* base = static_cast<char*>(data);
    const Chunks chunks{bytes, max_chunk_bytes_};
    for (size_t chunk = 0; chunk < chunks.count(); ++chunk) {
      DELTASERVE_RETURN_IF_ERROR(MpiCheck(
          MPI_Bcast(base + chunks.offset(chunk), chunks.size(chunk), MPI_BYTE, root, comm_),
          describe));
    }
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    return MpiCheck(MPI_Barrier(comm_), [&] {
      return absl::StrCat("mpi Barrier over ", size_, " ranks", WorldRankNote());
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    auto describe = [&] {
      return absl::StrCat("mpi Split (color ", color, ", key ", key, ") on rank ", rank_, " of ",
                          size_, WorldRankNote());
    };
    // A rank with a bad color still takes part (as MPI_UNDEFINED), so the
    // others are not left waiting in the collective.
    MPI_Comm part = MPI_COMM_NULL;
    DELTASERVE_RETURN_IF_ERROR(
        MpiCheck(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &part), describe));
    if (color < 0) {
      if (part != MPI_COMM_NULL) MPI_Comm_free(&part);
      return absl::InvalidArgumentError(absl::StrCat(describe(), " failed: colors must be >= 0"));
    }
    return Adopt(part, max_chunk_bytes_);
  }

 private:
  MpiCommunicator(MPI_Comm comm, size_t max_chunk_bytes)
      : comm_(comm), max_chunk_bytes_(max_chunk_bytes) {}

  absl::Status Initialize() {
    auto describe = [] { return std::string("mpi communicator setup"); };
    DELTASERVE_RETURN_IF_ERROR(
        MpiCheck(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), describe));
    DELTASERVE_RETURN_IF_ERROR(MpiCheck(MPI_Comm_rank(comm_, &rank_), describe));
    DELTASERVE_RETURN_IF_ERROR(MpiCheck(MPI_Comm_size(comm_, &size_), describe));
    // MPI_TAG_UB is an attribute of MPI_COMM_WORLD (at least 32767).
    void* tag_ub = nullptr;
    int found = 0;
    DELTASERVE_RETURN_IF_ERROR(
        MpiCheck(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found), describe));
    tag_ub_ = found ? *static_cast<int*>(tag_ub) : 32767;
    // World ranks of our members, so messages from a split communicator say
    // which process a peer is.
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Group world_group = MPI_GROUP_NULL;
    std::vector<int> local(static_cast<size_t>(size_));
    std::iota(local.begin(), local.end(), 0);
    world_ranks_.assign(local.size(), MPI_UNDEFINED);
    absl::Status status = MpiCheck(MPI_Comm_group(comm_, &group), describe);
    if (status.ok()) status = MpiCheck(MPI_Comm_group(MPI_COMM_WORLD, &world_group), describe);
    if (status.ok()) {
      status = MpiCheck(
          MPI_Group_translate_ranks(group, size_, local.data(), world_group, world_ranks_.data()),
          describe);
    }
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
    DELTASERVE_RETURN_IF_ERROR(status);
    int world_size = 0;
    DELTASERVE_RETURN_IF_ERROR(MpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world_size), describe));
    ranks_are_world_ranks_ = world_size == size_ && world_ranks_ == local;
    return absl::OkStatus();
  }

  // "world rank 3" when a peer's rank here differs from its world rank.
  std::string WorldRankOf(int peer) const {
    if (ranks_are_world_ranks_ || peer < 0 || peer >= size_) return "";
    return absl::StrCat("world rank ", world_ranks_[static_cast<size_t>(peer)]);
  }
  // "rank 3", or "rank 1 (world rank 3)".
  std::string PeerName(int peer) const {
    const std::string world = WorldRankOf(peer);
    return world.empty() ? absl::StrCat("rank ", peer)
                         : absl::StrCat("rank ", peer, " (", world, ")");
  }
  // " (this is world rank 5)" for a split communicator, for collectives.
  std::string WorldRankNote() const {
    if (ranks_are_world_ranks_) return "";
    return absl::StrCat(" (this is world rank ", world_ranks_[static_cast<size_t>(rank_)], ")");
  }
  std::string OutOfRange(int peer) const {
    return absl::StrCat("rank ", peer, " is out of range: this communicator has ranks 0..",
                        size_ - 1);
  }
  // "mpi Recv from rank 3 (tag 7)", "mpi Recv from rank 1 (world rank 3, tag 7)"
  std::string Describe(const char* op, const char* direction, int peer, int tag) const {
    const std::string world = WorldRankOf(peer);
    return absl::StrCat("mpi ", op, " ", direction, " rank ", peer, " (", world,
                        world.empty() ? "" : ", ", "tag ", tag, ")");
  }

  absl::Status CheckPointToPoint(const char* op, const char* direction, const void* data,
                                 size_t bytes, int peer, int tag) const {
    std::string why;
    if (peer < 0 || peer >= size_) {
      why = OutOfRange(peer);
    } else if (tag < 0 || tag > tag_ub_) {
      why = absl::StrCat("tag must be in 0..", tag_ub_);
    } else if (data == nullptr && bytes > 0) {
      why = absl::StrCat("null buffer for ", bytes, " bytes");
    } else {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(op, direction, peer, tag), " failed: ", why));
  }

  MPI_Comm comm_;
  size_t max_chunk_bytes_;
  int rank_ = 0;
  int size_ = 0;
  int tag_ub_ = 32767;
  std::vector<int> world_ranks_;  // [size_]
  bool ranks_are_world_ranks_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> InitMpiWorld(int* argc, char*** argv) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    return absl::FailedPreconditionError("InitMpiWorld: MPI was already finalized");
  }
  if (!initialized) {
    // Open MPI's TCP transport moves a large message on only inside the
    // sender's MPI calls, and a pipeline stage computing its next chunk makes
    // none: the boundary it sent waited for that chunk, and pipelined prefill
    // across hosts ran slower than one process (docs/performance.md). The
    // transport's progress thread moves it meanwhile. The environment's
    // OMPI_MCA_btl_tcp_progress_thread=0 keeps it off; other MPI libraries
    // ignore the variable.
    setenv("OMPI_MCA_btl_tcp_progress_thread", "1", /*overwrite=*/0);
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
      return absl::InternalError(absl::StrCat("MPI_Init_thread failed with error code ", rc));
    }
    g_initialized_here = true;
    if (provided < MPI_THREAD_FUNNELED) {
      return absl::FailedPreconditionError(
          absl::StrCat("MPI_Init_thread: the MPI library provides thread level ", provided,
                       ", below MPI_THREAD_FUNNELED (", MPI_THREAD_FUNNELED, ")"));
    }
  }
  auto describe = [] { return std::string("InitMpiWorld"); };
  DELTASERVE_RETURN_IF_ERROR(
      MpiCheck(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), describe));
  int world_size = 0;
  DELTASERVE_RETURN_IF_ERROR(MpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world_size), describe));
  DELTASERVE_RETURN_IF_ERROR(CheckNotSingletonFallback(world_size));
  MPI_Comm world = MPI_COMM_NULL;
  DELTASERVE_RETURN_IF_ERROR(MpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &world), describe));
  return MpiCommunicator::Adopt(world, MaxChunkBytes());
}

void FinalizeMpi() {
  if (g_initialized_here && MpiIsRunning()) MPI_Finalize();
}

void AbortMpi(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (MpiIsRunning()) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace deltaserve
