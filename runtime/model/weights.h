// The model's weights in memory, arranged for the kernels. Matrices stay in
// the dtype the checkpoint stores (bf16, MXFP4 experts, float32) and are views
// of the mapped file wherever this rank uses a tensor as stored (all of it,
// or a block of its rows); tensors that read the same input are concatenated
// row-wise so one GEMM serves them (q/k/v, MoE w1/w3, dense gate/up), copies
// in the stored dtype, as are column slices and the MLA key up-projection,
// pre-transposed per head for the absorbed decode form. Vectors (norm gains,
// biases, convolution taps, gates' parameters) are float32: they are a few
// thousandths of the bytes, and MODEL.md keeps several of them in float32.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "kernels/workspace.h"
#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/shard.h"

namespace deltaserve {

// A float32 vector weight (a norm's gains, a bias, convolution taps) in a
// Buffer on the weights' device, as the ops take it: [1, n], or [rows, cols]
// of its values in order (convolution taps). Made from the loader's values on
// the CPU; PlaceWeights puts it on the model's device.
class VectorWeight {
 public:
  VectorWeight() = default;
  // `values` copied into a CPU Buffer; none gives an empty weight.
  static VectorWeight FromHost(std::span<const float> values);

  bool empty() const { return values_.empty(); }
  int64_t size() const { return values_.cols(); }
  int64_t bytes() const { return size() * static_cast<int64_t>(sizeof(float)); }
  kernels::Device device() const { return values_.device(); }
  kernels::Tensor view() const { return values_; }  // [1, n]; empty when empty
  kernels::Tensor view(int64_t rows, int64_t cols) const;
  // The same values in a Buffer on `device`, copied in its workspace's
  // stream order.
  void MoveTo(kernels::Device device);

 private:
  kernels::Buffer values_;
};

// A weight matrix in its stored dtype: a kernels::Tensor and whatever keeps
// its bytes alive (the mapped checkpoint, or this weight's own copy).
class Weight {
 public:
  Weight() = default;
  Weight(kernels::Tensor tensor, std::shared_ptr<const void> owner, bool mapped)
      : tensor_(tensor), owner_(std::move(owner)), mapped_(mapped) {}

  const kernels::Tensor& tensor() const { return tensor_; }
  operator const kernels::Tensor&() const { return tensor_; }  // NOLINT: a view of it
  bool empty() const { return tensor_.empty(); }
  int64_t rows() const { return tensor_.rows; }
  int64_t cols() const { return tensor_.cols; }
  int64_t elements() const { return tensor_.rows * tensor_.cols; }
  // Bytes held: codes and scales for MXFP4.
  int64_t bytes() const { return tensor_.rows * (tensor_.RowBytes() + tensor_.ScaleRowBytes()); }
  // A view of the mapped checkpoint rather than a copy.
  bool mapped() const { return mapped_; }
  // The precision products with it may use (kernels::Tensor::compute).
  void set_compute(kernels::DType compute) { tensor_.compute = compute; }

  // A weight with bytes of its own for [rows, cols] of `dtype`, to be filled
  // through MutableData / MutableScales (kMxfp4 only) before use.
  static Weight Allocate(kernels::DType dtype, int64_t rows, int64_t cols);
  uint8_t* MutableData() const;
  uint8_t* MutableScales() const;

 private:
  kernels::Tensor tensor_;
  std::shared_ptr<const void> owner_;
  bool mapped_ = false;
};

struct KdaWeights {
  Weight qkv_proj;        // [3 * H * d, D]: q, k, v rows
  VectorWeight qkv_conv;  // [3 * H * d, W]
  Weight f_a;             // [rank, D]
  Weight f_b;             // [H * d, rank]
  Weight b_proj;          // [H, D]
  VectorWeight a_log;     // [H] (padding dropped)
  VectorWeight dt_bias;   // [H * d]
  Weight g_proj;          // full rank: [H * d, D]
  Weight g_a, g_b;        // low rank: [rank, D], [H * d, rank]
  VectorWeight o_norm;    // [d]
  Weight o_proj;          // [D, H * d]
};

struct MlaWeights {
  Weight q_a, q_b;         // q-LoRA: [ql, D], [n * (P + R), ql]
  VectorWeight q_a_norm;   // [ql]
  Weight q_proj;           // plain: [n * (P + R), D]
  Weight kv_a;             // [C + R, D]
  VectorWeight kv_a_norm;  // [C]
  Weight kv_b;             // [n * (P + Vd), C]: per head P key rows then Vd value rows
  Weight w_uk_t;           // [n * C, P]: key rows of kv_b transposed per head (absorbed decode)
  Weight g_proj;           // output gate [n * Vd, D] (K3), else empty
  Weight o_proj;           // [D, n * Vd]
};

struct FfnWeights {
  bool moe = false;
  // Dense
  Weight gate_up;  // [2 * I, D]
  Weight down;     // [D, I]
  // MoE
  Weight router;                   // [E, D]
  VectorWeight router_bias;        // [E]
  std::vector<Weight> expert_w13;  // each [2 * Ie, Din]; empty if on another TP rank
  std::vector<Weight> expert_w2;   // each [Din, Ie]
  Weight shared_gate_up;           // [2 * Is, D], empty without shared experts
  Weight shared_down;              // [D, Is]
  Weight latent_down;              // [L, D] (K3 latent MoE), else empty
  Weight latent_up;                // [D, L]
  VectorWeight latent_norm;        // [L]
};

// K3 attention-residual mix parameters: norm and projection weights
// (arch/kimi_k3.cc loads and uses them).
struct ResMixWeights {
  VectorWeight norm;  // [D]
  VectorWeight proj;  // [D]
};

struct LayerWeights {
  LayerKind kind = LayerKind::kKda;
  VectorWeight input_norm, post_attention_norm;  // [D]
  KdaWeights kda;
  MlaWeights mla;
  FfnWeights ffn;
  ResMixWeights attn_res, mlp_res;  // K3 only
};

struct ModelWeights {
  Weight embed;                      // [V, D]
  VectorWeight norm;                 // [D]
  Weight lm_head;                    // [V, D] (the embedding when tied)
  ResMixWeights output_res;          // K3 only
  std::vector<LayerWeights> layers;  // all layers; those of other stages empty
};

// Every matrix of `w` (empty ones included), for totals by dtype.
void ForEachMatrix(const ModelWeights& w, const std::function<void(const Weight&)>& fn);
void ForEachMatrix(ModelWeights* w, const std::function<void(Weight&)>& fn);
// Every vector weight of `w` (empty ones included).
void ForEachVector(const ModelWeights& w, const std::function<void(const VectorWeight&)>& fn);
void ForEachVector(ModelWeights* w, const std::function<void(VectorWeight&)>& fn);
// What a rank's weights hold: bytes of the matrices by dtype name ("bf16",
// "mxfp4", "f32") and of the float32 vectors under "f32 vectors"; and of the
// matrices, how many bytes are views of the mapped checkpoint and how many
// copies made at load.
struct WeightBytes {
  std::map<std::string, int64_t> by_dtype;
  int64_t mapped = 0, copied = 0;
};
WeightBytes CountWeightBytes(const ModelWeights& w);

// Places the loaded weights on `device`, in one pass over them. On the CPU
// they stay as loaded (views of the mapped checkpoint in their stored dtype,
// and the copies made at load), or with huge_pages the matrices move into one
// region of memory on transparent huge pages where the kernel has them
// (MoveToHugePages in weights.cc says why; a model of under 32 MiB of
// matrices stays as loaded). On CUDA each matrix is copied once, as stored
// (MXFP4 codes with their scales), into device memory of its own (one copy
// for a head tied to the embedding), and the host bytes are let go; a device
// that cannot hold them is ResourceExhausted, naming what failed, and CUDA
// without an active backend is FailedPrecondition saying why.
absl::Status PlaceWeights(ModelWeights* w, kernels::Device device, bool huge_pages = true);

// Loads the tensors `shard` owns: its layers, and of those its
// TP part as each tensor's spec splits it (tp_split.h; other ranks' routed
// experts stay empty); the embedding on the first stage, the head on the
// last. Only those bytes are read from the mapped files; *bytes_read
// (optional) receives their count. The checkpoint must have passed
// ValidateCheckpoint. Mapped weights keep `checkpoint` alive.
absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config,
                                         std::shared_ptr<const Checkpoint> checkpoint,
                                         const ModelShard& shard, int64_t* bytes_read = nullptr);

}  // namespace deltaserve
