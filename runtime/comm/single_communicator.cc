#include "runtime/comm/single_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltaserve {
namespace {

class DoneRequest final : public SendRequest {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

// Checks shared by Send, Isend and Recv: the only peer is rank 0.
absl::Status CheckPointToPoint(const char* op, const char* direction, const void* data,
                               size_t bytes, int peer, int tag) {
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("single ", op, " ", direction, " rank ", peer,
                                                   " (tag ", tag, ") failed: ", why));
  };
  if (peer != 0) return error("rank out of range: a single-process communicator has only rank 0");
  if (tag < 0) return error("tags must be >= 0");
  if (data == nullptr && bytes > 0) return error(absl::StrCat("null buffer for ", bytes, " bytes"));
  return absl::OkStatus();
}

}  // namespace

absl::Status SingleCommunicator::Send(const void* data, size_t bytes, int dest, int tag) {
  if (absl::Status status = CheckPointToPoint("Send", "to", data, bytes, dest, tag); !status.ok()) {
    return status;
  }
  const char* begin = static_cast<const char*>(data);
  std::vector<char> message(begin, begin + bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  queues_[tag].push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SendRequest>> SingleCommunicator::Isend(const void* data,
                                                                       size_t bytes, int dest,
                                                                       int tag) {
  if (absl::Status status = CheckPointToPoint("Isend", "to", data, bytes, dest, tag);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = Send(data, bytes, dest, tag); !status.ok()) return status;
  return std::make_unique<DoneRequest>();
}

absl::Status SingleCommunicator::Recv(void* data, size_t bytes, int src, int tag) {
  if (absl::Status status = CheckPointToPoint("Recv", "from", data, bytes, src, tag);
      !status.ok()) {
    return status;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = queues_.find(tag);
  if (it == queues_.end() || it->second.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "single Recv from rank 0 (tag ", tag,
        ") failed: no message with this tag was sent, and a single-process communicator has "
        "no other process that could send one"));
  }
  std::vector<char>& message = it->second.front();
  if (message.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("single Recv from rank 0 (tag ", tag,
                                                   ") failed: the message has ", message.size(),
                                                   " bytes, the receive expects ", bytes));
  }
  if (bytes > 0) std::memcpy(data, message.data(), bytes);
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return absl::OkStatus();
}

absl::Status SingleCommunicator::AllReduceSum(float* data, size_t count) {
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("single AllReduceSum failed: null buffer for ", count, " floats"));
  }
  return absl::OkStatus();
}

absl::Status SingleCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("single Broadcast from root rank ", root,
                     " failed: rank out of range: a single-process communicator has only rank 0"));
  }
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "single Broadcast from root rank 0 failed: null buffer for ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> SingleCommunicator::Split(int color, int key) {
  if (color < 0) {
    return absl::InvalidArgumentError(absl::StrCat("single Split (color ", color, ", key ", key,
                                                   ") failed: colors must be >= 0"));
  }
  return std::make_unique<SingleCommunicator>();
}

size_t SingleCommunicator::PendingMessages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [tag, queue] : queues_) n += queue.size();
  return n;
}

}  // namespace deltaserve
