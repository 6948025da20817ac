#include "runtime/engine/session.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {

absl::StatusOr<std::vector<float>> Session::Prefill(std::span<const int32_t> tokens, int64_t chunk,
                                                    bool all_logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill: no tokens");
  if (chunk <= 0) chunk = static_cast<int64_t>(tokens.size());
  std::vector<float> logits;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - begin);
    const ForwardInput input{state_.get(), tokens.subspan(begin, n), all_logits};
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> piece, model_.Forward(std::span(&input, 1)));
    if (all_logits) {
      logits.insert(logits.end(), piece.begin(), piece.end());
    } else {
      logits = std::move(piece);
    }
  }
  return logits;
}

absl::StatusOr<std::vector<float>> Session::Decode(int32_t token) {
  const ForwardInput input{state_.get(), std::span(&token, 1), false};
  return model_.Forward(std::span(&input, 1));
}

absl::StatusOr<GenerateStats> Generate(SequenceRunner& runner, int64_t vocab,
                                       std::span<const int32_t> prompt,
                                       const GenerateOptions& options,
                                       const std::function<void(int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (options.max_tokens <= 0) return stats;
  kernels::Rng rng(options.seed);
  // Runners with logits sample (the same draws everywhere, from the same
  // seed); the output runner's choice is shared with the rest.
  auto next = [&](const std::vector<float>& logits) -> absl::StatusOr<int32_t> {
    const int32_t token =
        runner.HasLogits() ? kernels::Sample(logits.data(), vocab, options.sampling, rng) : 0;
    return runner.ShareToken(token);
  };
  const auto start = Clock::now();
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> logits,
                              runner.Prefill(prompt, options.prefill_chunk));
  DELTASERVE_ASSIGN_OR_RETURN(int32_t token, next(logits));
  const auto first = Clock::now();
  stats.time_to_first_token_s = seconds(start, first);
  on_token(token);
  stats.generated_tokens = 1;
  const auto stops = [&](int32_t t) {
    return std::find(options.stop_ids.begin(), options.stop_ids.end(), t) != options.stop_ids.end();
  };
  while (stats.generated_tokens < options.max_tokens && !stops(token)) {
    DELTASERVE_ASSIGN_OR_RETURN(logits, runner.Decode(token));
    DELTASERVE_ASSIGN_OR_RETURN(token, next(logits));
    on_token(token);
    ++stats.generated_tokens;
  }
  stats.decode_s = seconds(first, Clock::now());
  return stats;
}

absl::StatusOr<std::vector<float>> ScoreTokens(SequenceRunner& runner,
                                               std::span<const int32_t> tokens, int64_t chunk,
                                               int64_t decode_from) {
  const size_t split =
      decode_from <= 0 ? tokens.size() : std::min<size_t>(decode_from, tokens.size());
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> logits,
                              runner.Prefill(tokens.first(split), chunk, /*all_logits=*/true));
  for (size_t i = split; i < tokens.size(); ++i) {
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<float> step, runner.Decode(tokens[i]));
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

}  // namespace deltaserve
