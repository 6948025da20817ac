#include "runtime/engine/pipeline.h"

#include <algorithm>
#include <chrono>

#include "runtime/common/status_macros.h"

namespace deltaserve {

PipelineRunner::PipelineRunner(const Model& model, const WorldLayout& layout, Communicator& world)
    : stage_(model, layout, world), state_(model.NewSequence()) {}

absl::StatusOr<std::vector<float>> PipelineRunner::Prefill(std::span<const int32_t> tokens,
                                                           int64_t chunk, bool all_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill: no tokens");
  const auto start = std::chrono::steady_clock::now();
  if (chunk <= 0) chunk = static_cast<int64_t>(tokens.size());
  std::vector<float> logits;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - begin);
    const bool last_piece = begin + n == tokens.size();
    const ForwardInput input{state_.get(), tokens.subspan(begin, n), all_logits};
    std::vector<float> piece;
    DELTASERVE_RETURN_IF_ERROR(stage_.Forward(std::span(&input, 1), &piece));
    if (all_logits || last_piece) logits.insert(logits.end(), piece.begin(), piece.end());
  }
  DELTASERVE_RETURN_IF_ERROR(stage_.DrainSends());
  stage_.stats().busy_wall_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return logits;
}

absl::StatusOr<std::vector<float>> PipelineRunner::Decode(int32_t token) {
  return Prefill(std::span(&token, 1), 1, false);
}

absl::StatusOr<int32_t> PipelineRunner::ShareToken(int32_t token) {
  DELTASERVE_RETURN_IF_ERROR(stage_.world().Broadcast(&token, sizeof(token), stage_.output_rank()));
  return token;
}

}  // namespace deltaserve
