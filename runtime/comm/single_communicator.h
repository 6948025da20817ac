// The communicator of a one-process world (`deltaserve serve`, tests, tools):
// no MPI needed. Collectives are no-ops (the sum / broadcast over one rank is
// the input). Send / Recv to rank 0 (itself) go through an in-memory queue per
// tag, so code written for a pipeline also runs when both ends are this
// process: Send and Isend copy the bytes and return at once; Recv takes the
// oldest queued message of its tag, and since nothing else could ever send it,
// a Recv with no queued message is an error (FailedPrecondition) instead of a
// hang. Thread-safe.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace deltaserve {

class SingleCommunicator final : public Communicator {
 public:
  SingleCommunicator() = default;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string Name() const override { return "single"; }

  absl::Status Send(const void* data, size_t bytes, int dest, int tag) override;
  // The message must have exactly `bytes` bytes; on a mismatch it stays queued.
  absl::Status Recv(void* data, size_t bytes, int src, int tag) override;
  // Copies like Send; the request's Wait returns OK.
  absl::StatusOr<std::unique_ptr<SendRequest>> Isend(const void* data, size_t bytes, int dest,
                                                     int tag) override;

  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override { return absl::OkStatus(); }
  // A new, empty single communicator (its own queue).
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

  // Messages sent to self and not yet received, over all tags.
  size_t PendingMessages() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, std::deque<std::vector<char>>> queues_;  // by tag, oldest first
};

}  // namespace deltaserve
