#include "runtime/engine/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sends older than this many chunks are waited for before the next: bounds
// the memory of packets in flight while keeping the stages overlapped.
constexpr size_t kMaxInFlight = 4;
constexpr int kActivationTag = 1;

}  // namespace

PipelineRunner::PipelineRunner(const Model& model, const WorldLayout& layout,
                               Communicator& world)
    : model_(model),
      layout_(layout),
      world_(world),
      coord_(layout.CoordOf(world.rank())),
      first_stage_(coord_.stage == 0),
      last_stage_(coord_.stage == layout.pp - 1),
      state_(model.NewSequence()) {}

absl::Status PipelineRunner::Step(std::span<const int32_t> tokens, bool all_logits,
                                  std::vector<float>* logits) {
  const ForwardInput input{state_.get(), tokens, all_logits};
  // Every stage validates the same tokens against the same length, so a bad
  // request fails on all ranks alike instead of leaving a peer waiting.
  DELTASERVE_ASSIGN_OR_RETURN(PreparedBatch batch, model_.Prepare(std::span(&input, 1)));
  const int64_t D = model_.config().hidden_size;
  const int64_t rows = batch.rows.rows();
  Activations act;
  if (first_stage_) {
    const auto t0 = Clock::now();
    act = model_.Embed(batch.tokens);
    stats_.compute_s += Since(t0);
  } else {
    const int64_t bank = model_.BankSizeBefore(model_.shard().layer_begin);
    std::vector<float> packet((bank + 1) * rows * D);
    DELTASERVE_RETURN_IF_ERROR(world_.Recv(
        packet.data(), packet.size() * sizeof(float),
        layout_.Rank(coord_.replica, coord_.stage - 1, coord_.tp_rank), kActivationTag));
    act.rows = rows;
    for (int64_t b = 0; b < bank; ++b) {
      act.bank.emplace_back(packet.begin() + b * rows * D, packet.begin() + (b + 1) * rows * D);
    }
    act.prefix.assign(packet.begin() + bank * rows * D, packet.end());
  }
  const auto t0 = Clock::now();
  DELTASERVE_RETURN_IF_ERROR(model_.RunLayers(batch.rows, &act));
  if (last_stage_) {
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
  DELTASERVE_ASSIGN_OR_RETURN(
      send.request,
      world_.Isend(send.packet.data(), bytes,
                   layout_.Rank(coord_.replica, coord_.stage + 1, coord_.tp_rank),
                   kActivationTag));
  stats_.bytes_sent += static_cast<int64_t>(bytes);
  stats_.tokens_sent += rows;
  in_flight_.push_back(std::move(send));
  while (in_flight_.size() > kMaxInFlight) {
    DELTASERVE_RETURN_IF_ERROR(in_flight_.front().request->Wait());
    in_flight_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status PipelineRunner::DrainSends() {
  while (!in_flight_.empty()) {
    DELTASERVE_RETURN_IF_ERROR(in_flight_.front().request->Wait());
    in_flight_.pop_front();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> PipelineRunner::Prefill(std::span<const int32_t> tokens,
                                                           int64_t chunk, bool all_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill: no tokens");
  const auto start = Clock::now();
  if (chunk <= 0) chunk = static_cast<int64_t>(tokens.size());
  std::vector<float> logits;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - begin);
    const bool last_piece = begin + n == tokens.size();
    std::vector<float> piece;
    DELTASERVE_RETURN_IF_ERROR(Step(tokens.subspan(begin, n), all_logits, &piece));
    if (all_logits || last_piece) logits.insert(logits.end(), piece.begin(), piece.end());
  }
  DELTASERVE_RETURN_IF_ERROR(DrainSends());
  stats_.busy_wall_s += Since(start);
  return logits;
}

absl::StatusOr<std::vector<float>> PipelineRunner::Decode(int32_t token) {
  return Prefill(std::span(&token, 1), 1, false);
}

absl::StatusOr<int32_t> PipelineRunner::ShareToken(int32_t token) {
  DELTASERVE_RETURN_IF_ERROR(world_.Broadcast(
      &token, sizeof(token), layout_.Rank(coord_.replica, layout_.pp - 1, 0)));
  return token;
}

}  // namespace deltaserve
