#include "runtime/engine/stage_runner.h"

#include <chrono>

#include "runtime/common/status_macros.h"
#include "runtime/engine/message_tags.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sends older than this many batches are waited for before the next: bounds
// the memory of packets in flight while keeping the stages overlapped.
constexpr size_t kMaxInFlight = 4;

}  // namespace

StageRunner::StageRunner(const Model& model, const WorldLayout& layout, Communicator& control,
                         DataCommunicator& stage)
    : model_(model),
      layout_(layout),
      control_(control),
      stage_(stage),
      coord_(layout.CoordOf(control.rank())) {}

absl::Status StageRunner::Forward(std::span<const ForwardInput> inputs,
                                  std::vector<float>* logits) {
  // Every stage validates the same tokens against the same lengths, so a bad
  // request fails on all ranks alike instead of leaving a peer waiting.
  DELTASERVE_ASSIGN_OR_RETURN(PreparedBatch batch, model_.Prepare(inputs));
  const int64_t D = model_.config().hidden_size;
  const int64_t rows = batch.rows.rows();
  Activations act;
  if (first_stage()) {
    const auto t0 = Clock::now();
    act = model_.Embed(batch.tokens);
    stats_.compute_s += Since(t0);
  } else {
    const int64_t bank = model_.BankSizeBefore(model_.shard().layer_begin);
    std::vector<float> packet((bank + 1) * rows * D);
    DELTASERVE_RETURN_IF_ERROR(stage_.Recv(packet.data(), packet.size() * sizeof(float),
                                           coord_.stage - 1, message_tags::kActivation, stream_));
    act.rows = rows;
    for (int64_t b = 0; b < bank; ++b) {
      act.bank.emplace_back(packet.begin() + b * rows * D, packet.begin() + (b + 1) * rows * D);
    }
    act.prefix.assign(packet.begin() + bank * rows * D, packet.end());
  }
  const auto t0 = Clock::now();
  DELTASERVE_RETURN_IF_ERROR(model_.RunLayers(batch.rows, &act));
  if (last_stage()) {
    std::vector<float> out = model_.Logits(act, batch.output_rows);
    logits->insert(logits->end(), out.begin(), out.end());
    stats_.compute_s += Since(t0);
    return absl::OkStatus();
  }
  stats_.compute_s += Since(t0);
  InFlight send;
  send.packet.reserve((act.bank.size() + 1) * rows * D);
  for (const auto& b : act.bank) send.packet.insert(send.packet.end(), b.begin(), b.end());
  send.packet.insert(send.packet.end(), act.prefix.begin(), act.prefix.end());
  const size_t bytes = send.packet.size() * sizeof(float);
  DELTASERVE_ASSIGN_OR_RETURN(send.request,
                              stage_.Isend(send.packet.data(), bytes, coord_.stage + 1,
                                           message_tags::kActivation, stream_));
  stats_.bytes_sent += static_cast<int64_t>(bytes);
  stats_.tokens_sent += rows;
  in_flight_.push_back(std::move(send));
  while (in_flight_.size() > kMaxInFlight) {
    DELTASERVE_RETURN_IF_ERROR(in_flight_.front().request->Wait());
    in_flight_.pop_front();
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
