// The layers of both architectures, over a batch of sequences whose new tokens
// are concatenated row-wise: sequence b owns rows [offsets[b], offsets[b+1]).
// Token-independent work (projections, FFN) runs on all rows at once; the
// token-mixing parts (short convolution, KDA recurrence, MLA attention) run
// per sequence against that sequence's state.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/stream.h"
#include "runtime/comm/data_communicator.h"
#include "runtime/model/config.h"
#include "runtime/model/sequence_state.h"
#include "runtime/model/weights.h"

namespace deltaserve {

struct BatchRows {
  std::vector<int64_t> offsets;        // size sequences + 1, offsets[0] = 0
  std::vector<SequenceState*> states;  // one per sequence

  int64_t rows() const { return offsets.back(); }
  int64_t sequences() const { return static_cast<int64_t>(states.size()); }
  int64_t Begin(int64_t b) const { return offsets[b]; }
  int64_t Count(int64_t b) const { return offsets[b + 1] - offsets[b]; }
};

// What flows between layers for the rows of a batch: Kimi Linear's hidden
// state is `prefix` with an empty bank; K3 carries the current block's partial
// sum `prefix` and the completed block sums `bank` (the embedding first).
// Between pipeline stages this is the packet, bank entries then prefix.
struct Activations {
  int64_t rows = 0;
  std::vector<std::vector<float>> bank;  // each [rows, D]
  std::vector<float> prefix;             // [rows, D]
};

// x: the normalised layer input [rows, D]; out: the mixer output [rows, D].
// Each advances the per-layer state of every sequence by its rows. `config`
// is the rank's LocalConfig (its share of the heads); with a tensor-parallel
// group `tp` (its TP data communicator; null: one rank) the partial outputs
// are summed across it, so every rank ends with the whole result. Errors come
// from the communicator.
absl::Status KdaForward(const ModelConfig& config, const KdaWeights& w, int64_t layer,
                        const BatchRows& batch, const float* x, float* out, DataCommunicator* tp);
absl::Status MlaForward(const ModelConfig& config, const MlaWeights& w, int64_t layer,
                        const BatchRows& batch, const float* x, float* out, DataCommunicator* tp);

// Dense or MoE FFN on all rows: out[rows, D] = ffn(x).
absl::Status FfnForward(const ModelConfig& config, const FfnWeights& w, int64_t rows,
                        const float* x, float* out, DataCommunicator* tp);

// The logistic function, for the layers' gates.
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Sums data[count] across `tp` in place, ordered on `stream` (the layers run
// on the host: the CPU stream, complete on return); nothing without a group.
absl::Status TpAllReduce(DataCommunicator* tp, float* data, int64_t count,
                         const kernels::Stream& stream);

}  // namespace deltaserve
