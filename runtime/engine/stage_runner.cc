#include "runtime/engine/stage_runner.h"

#include <chrono>

#include "kernels/convert.h"
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

// The packets are ordered on the stream of the model's device's workspace,
// where the layers' ops run.
const kernels::Stream& StageRunner::stream() const {
  return kernels::Workspace::Of(model_.device()).stream();
}

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
    // The packet: bank entries, then the prefix, each [rows, D], in the
    // boundary's dtype.
    const int64_t bank = model_.BankSizeBefore(model_.shard().layer_begin);
    const kernels::Buffer packet(model_.device(), model_.options().boundary_dtype,
                                 (bank + 1) * rows, D);
    DELTASERVE_RETURN_IF_ERROR(stage_.Recv(packet.view().data, packet.bytes(), coord_.stage - 1,
                                           message_tags::kActivation, stream()));
    act.rows = rows;
    for (int64_t b = 0; b <= bank; ++b) {
      kernels::Buffer part(packet.device(), kernels::DType::kF32, rows, D);
      kernels::Convert(packet.view().Rows(b * rows, rows), part);
      (b < bank ? act.bank.emplace_back() : act.prefix) = std::move(part);
    }
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
  const int64_t entries = static_cast<int64_t>(act.bank.size()) + 1;
  send.packet =
      kernels::Buffer(act.prefix.device(), model_.options().boundary_dtype, entries * rows, D);
  for (int64_t b = 0; b < entries; ++b) {
    const kernels::Tensor part = b + 1 < entries ? kernels::Tensor(act.bank[b]) : act.prefix;
    kernels::Convert(part, send.packet.view().Rows(b * rows, rows));
  }
  const size_t bytes = send.packet.bytes();
  DELTASERVE_ASSIGN_OR_RETURN(send.request,
                              stage_.Isend(send.packet.view().data, bytes, coord_.stage + 1,
                                           message_tags::kActivation, stream()));
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
