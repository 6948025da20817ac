// The layers of both architectures, over a batch of sequences whose new tokens
// are concatenated row-wise: sequence b owns rows [offsets[b], offsets[b+1]).
// Token-independent work (projections, FFN) runs on all rows at once; the
// token-mixing parts (short convolution, KDA recurrence, MLA attention) run
// per sequence against that sequence's state.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/tensor.h"
#include "kernels/workspace.h"
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
  std::vector<kernels::Buffer> bank;  // each f32 [rows, D]
  kernels::Buffer prefix;             // f32 [rows, D]
};

// x: the normalised layer input f32 [rows, D]; out: the mixer output f32
// [rows, D], contiguous. Each advances the per-layer state of every sequence
// by its rows. `config` is the rank's LocalConfig (its share of the heads);
// with a tensor-parallel group `tp` (null: one rank) the partial outputs are
// summed across it, so every rank ends with the whole result. Errors come
// from the communicator.
absl::Status KdaForward(const ModelConfig& config, const KdaWeights& w, int64_t layer,
                        const BatchRows& batch, const kernels::Tensor& x,
                        const kernels::MutableTensor& out, DataCommunicator* tp);
absl::Status MlaForward(const ModelConfig& config, const MlaWeights& w, int64_t layer,
                        const BatchRows& batch, const kernels::Tensor& x,
                        const kernels::MutableTensor& out, DataCommunicator* tp);

// Dense or MoE FFN on all rows: out [rows, D] = ffn(x [rows, D]).
absl::Status FfnForward(const ModelConfig& config, const FfnWeights& w, const kernels::Tensor& x,
                        const kernels::MutableTensor& out, DataCommunicator* tp);

// Sums the contiguous f32 `data` across `tp` in place, on the stream of its
// device's workspace; nothing without a group.
absl::Status TpAllReduce(DataCommunicator* tp, const kernels::MutableTensor& data);

}  // namespace deltaserve
