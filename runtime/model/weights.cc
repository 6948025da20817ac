#include "runtime/model/weights.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/convert.h"
#include "kernels/cuda/ops.h"
#include "kernels/workspace.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/arch/architecture.h"
#include "runtime/model/weight_loader.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {

VectorWeight VectorWeight::FromHost(std::span<const float> values) {
  VectorWeight v;
  if (values.empty()) return v;
  const int64_t n = static_cast<int64_t>(values.size());
  v.values_ = kernels::Buffer(kernels::Device::kCpu, kernels::DType::kF32, 1, n);
  kernels::Convert(kernels::Tensor::F32(values.data(), 1, n), v.values_);
  return v;
}

kernels::Tensor VectorWeight::view(int64_t rows, int64_t cols) const {
  DELTASERVE_CHECK(rows * cols == size());
  return view().Reshaped(rows, cols);
}

void VectorWeight::MoveTo(kernels::Device device) {
  if (empty() || values_.device() == device) return;
  kernels::Buffer moved(device, kernels::DType::kF32, 1, size());
  DELTASERVE_CHECK(values_.device() == kernels::Device::kCpu);
  kernels::Workspace::Of(device).CopyFromHost(moved.view().data, values_.view().data,
                                              static_cast<size_t>(bytes()));
  values_ = std::move(moved);
}

Weight Weight::Allocate(kernels::DType dtype, int64_t rows, int64_t cols) {
  kernels::Tensor t{nullptr, nullptr, dtype, kernels::Device::kCpu, rows, cols};
  const int64_t data_bytes = rows * t.RowBytes(), scale_bytes = rows * t.ScaleRowBytes();
  std::shared_ptr<uint8_t[]> bytes =
      std::make_shared_for_overwrite<uint8_t[]>(static_cast<size_t>(data_bytes + scale_bytes));
  t.data = bytes.get();
  if (scale_bytes > 0) t.scales = bytes.get() + data_bytes;
  return Weight(t, std::move(bytes), /*mapped=*/false);
}

uint8_t* Weight::MutableData() const {
  DELTASERVE_CHECK(!mapped_);
  return const_cast<uint8_t*>(static_cast<const uint8_t*>(tensor_.data));
}

uint8_t* Weight::MutableScales() const {
  DELTASERVE_CHECK(!mapped_);
  return const_cast<uint8_t*>(tensor_.scales);
}

namespace {

// Each Load / Concat reads this rank's part as the tensor's spec splits it.
absl::Status LoadKda(const ModelConfig& c, const WeightLoader& l, KdaWeights* w) {
  DELTASERVE_ASSIGN_OR_RETURN(w->qkv_proj,
                              l.ConcatRows({"q_proj.weight", "k_proj.weight", "v_proj.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(w->qkv_conv,
                              l.Concat({"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_a, l.Matrix("f_a_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->f_b, l.Matrix("f_b_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->b_proj, l.Matrix("b_proj.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->a_log, l.Load("A_log"));  // padding dropped
  DELTASERVE_ASSIGN_OR_RETURN(w->dt_bias, l.Load("dt_bias"));
  if (c.kda.full_rank_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Matrix("g_proj.weight"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_a, l.Matrix("g_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->g_b, l.Matrix("g_b_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_norm, l.Load("o_norm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Matrix("o_proj.weight"));
  return absl::OkStatus();
}

absl::Status LoadMla(const ModelConfig& c, const WeightLoader& l, MlaWeights* w) {
  const int64_t P = c.qk_nope_head_dim, Vd = c.v_head_dim, C = c.kv_lora_rank;
  if (c.q_lora_rank > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a, l.Matrix("q_a_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_a_norm, l.Load("q_a_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->q_b, l.Matrix("q_b_proj.weight"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(w->q_proj, l.Matrix("q_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a, l.Matrix("kv_a_proj_with_mqa.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_a_norm, l.Load("kv_a_layernorm.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->kv_b, l.Matrix("kv_b_proj.weight"));
  if (c.mla_output_gate) {
    DELTASERVE_ASSIGN_OR_RETURN(w->g_proj, l.Matrix("g_proj.weight"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(w->o_proj, l.Matrix("o_proj.weight"));

  // W_UK per head, [P, C] rows of kv_b, transposed to [C, P] in the stored
  // dtype (a permutation of elements, exact).
  const kernels::Tensor& kv_b = w->kv_b.tensor();
  const int64_t local = kv_b.rows / (P + Vd);  // this rank's heads
  if (kv_b.dtype == kernels::DType::kMxfp4) {
    return absl::UnimplementedError("kv_b_proj in MXFP4 is not supported");
  }
  const int64_t elem = kv_b.RowBytes() / C;
  w->w_uk_t = Weight::Allocate(kv_b.dtype, local * C, P);
  const auto* src = static_cast<const uint8_t*>(kv_b.data);
  uint8_t* dst = w->w_uk_t.MutableData();
  for (int64_t h = 0; h < local; ++h) {
    for (int64_t i = 0; i < P; ++i) {
      for (int64_t j = 0; j < C; ++j) {
        std::memcpy(dst + ((h * C + j) * P + i) * elem, src + ((h * (P + Vd) + i) * C + j) * elem,
                    static_cast<size_t>(elem));
      }
    }
  }
  return absl::OkStatus();
}

// A gated MLP's gate/up rows and down columns (this rank's share of its width).
absl::Status LoadGatedMlp(const WeightLoader& l, Weight* gate_up, Weight* down) {
  DELTASERVE_ASSIGN_OR_RETURN(*gate_up, l.ConcatRows({"gate_proj.weight", "up_proj.weight"}));
  DELTASERVE_ASSIGN_OR_RETURN(*down, l.Matrix("down_proj.weight"));
  return absl::OkStatus();
}

absl::Status LoadFfn(const ModelConfig& c, int64_t layer, const WeightLoader& l, FfnWeights* w) {
  if (!c.IsMoeLayer(layer)) return LoadGatedMlp(l.Under("mlp."), &w->gate_up, &w->down);
  w->moe = true;
  const WeightLoader m = l.Under("block_sparse_moe.");
  DELTASERVE_ASSIGN_OR_RETURN(w->router, m.Matrix("gate.weight"));
  DELTASERVE_ASSIGN_OR_RETURN(w->router_bias, m.Load("gate.e_score_correction_bias"));
  w->expert_w13.resize(c.num_experts);
  w->expert_w2.resize(c.num_experts);
  for (int64_t e = 0; e < c.num_experts; ++e) {
    // Empty unless this rank owns expert e.
    const WeightLoader x = m.Under(absl::StrCat("experts.", e, "."));
    DELTASERVE_ASSIGN_OR_RETURN(w->expert_w13[e], x.ConcatRows({"w1.weight", "w3.weight"}));
    DELTASERVE_ASSIGN_OR_RETURN(w->expert_w2[e], x.Matrix("w2.weight"));
  }
  if (c.num_shared_experts > 0) {
    DELTASERVE_RETURN_IF_ERROR(
        LoadGatedMlp(m.Under("shared_experts."), &w->shared_gate_up, &w->shared_down));
  }
  if (c.routed_expert_hidden_size > 0) {
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_down, m.Matrix("routed_expert_down_proj.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w->latent_up, m.Matrix("routed_expert_up_proj.weight"));
    if (c.latent_moe_use_norm) {
      DELTASERVE_ASSIGN_OR_RETURN(w->latent_norm, m.Load("routed_expert_norm.weight"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadWeights(const ModelConfig& config,
                                         std::shared_ptr<const Checkpoint> checkpoint,
                                         const ModelShard& shard, int64_t* bytes_read) {
  const ModelArchitecture& arch = ArchitectureOf(config);
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<TensorSpec> specs,
                              CheckpointTensors(config, *checkpoint));
  const WeightLoader top(std::move(checkpoint), specs, shard.tp_rank, shard.tp_size, bytes_read);
  const WeightLoader model = top.Under(config.ModelPrefix());
  ModelWeights w;
  if (shard.HasEmbedding()) {
    DELTASERVE_ASSIGN_OR_RETURN(w.embed, model.Matrix("embed_tokens.weight"));
  }
  if (HasHead(config, shard)) {
    DELTASERVE_ASSIGN_OR_RETURN(w.norm, model.Load("norm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(w.lm_head, top.Matrix(config.LmHeadName()));
    DELTASERVE_RETURN_IF_ERROR(arch.LoadHeadTensors(model, &w));
  }
  w.layers.resize(static_cast<size_t>(config.num_layers));
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    LayerWeights& layer = w.layers[i];
    const WeightLoader l = model.Under(absl::StrCat("layers.", i, "."));
    layer.kind = config.layer_kinds[i];
    DELTASERVE_ASSIGN_OR_RETURN(layer.input_norm, l.Load("input_layernorm.weight"));
    DELTASERVE_ASSIGN_OR_RETURN(layer.post_attention_norm,
                                l.Load("post_attention_layernorm.weight"));
    if (layer.kind == LayerKind::kKda) {
      DELTASERVE_RETURN_IF_ERROR(LoadKda(config, l.Under("self_attn."), &layer.kda));
    } else {
      DELTASERVE_RETURN_IF_ERROR(LoadMla(config, l.Under("self_attn."), &layer.mla));
    }
    DELTASERVE_RETURN_IF_ERROR(LoadFfn(config, i, l, &layer.ffn));
    DELTASERVE_RETURN_IF_ERROR(arch.LoadLayerTensors(l, &layer));
  }
  return w;
}

namespace {

// Both ForEachMatrix: W is ModelWeights or const ModelWeights.
template <typename W, typename Fn>
void VisitMatrices(W& w, const Fn& fn) {
  fn(w.embed);
  fn(w.lm_head);
  for (auto& l : w.layers) {
    auto& k = l.kda;
    for (auto* m : {&k.qkv_proj, &k.f_a, &k.f_b, &k.b_proj, &k.g_proj, &k.g_a, &k.g_b, &k.o_proj}) {
      fn(*m);
    }
    auto& a = l.mla;
    for (auto* m : {&a.q_a, &a.q_b, &a.q_proj, &a.kv_a, &a.kv_b, &a.w_uk_t, &a.g_proj, &a.o_proj}) {
      fn(*m);
    }
    auto& f = l.ffn;
    for (auto* m : {&f.gate_up, &f.down, &f.router, &f.shared_gate_up, &f.shared_down,
                    &f.latent_down, &f.latent_up}) {
      fn(*m);
    }
    for (auto& e : f.expert_w13) fn(e);
    for (auto& e : f.expert_w2) fn(e);
  }
}

}  // namespace

void ForEachMatrix(const ModelWeights& w, const std::function<void(const Weight&)>& fn) {
  VisitMatrices(w, fn);
}

void ForEachMatrix(ModelWeights* w, const std::function<void(Weight&)>& fn) {
  VisitMatrices(*w, fn);
}

namespace {

template <typename Weights, typename Fn>
void VisitVectors(Weights& w, Fn&& fn) {
  for (auto* v : {&w.norm, &w.output_res.norm, &w.output_res.proj}) fn(*v);
  for (auto& l : w.layers) {
    for (auto* v : {&l.input_norm, &l.post_attention_norm, &l.attn_res.norm, &l.attn_res.proj,
                    &l.mlp_res.norm, &l.mlp_res.proj, &l.kda.qkv_conv, &l.kda.a_log, &l.kda.dt_bias,
                    &l.kda.o_norm, &l.mla.q_a_norm, &l.mla.kv_a_norm, &l.ffn.router_bias,
                    &l.ffn.latent_norm}) {
      fn(*v);
    }
  }
}

}  // namespace

void ForEachVector(const ModelWeights& w, const std::function<void(const VectorWeight&)>& fn) {
  VisitVectors(w, fn);
}

void ForEachVector(ModelWeights* w, const std::function<void(VectorWeight&)>& fn) {
  VisitVectors(*w, fn);
}

namespace {

// Replaces every matrix of `w` by place(it), once for each distinct matrix: a
// matrix seen before (the head tied to the embedding) takes the same place.
// Stops at place's first error.
absl::Status PlaceEachMatrix(ModelWeights* w,
                             const std::function<absl::StatusOr<Weight>(const Weight&)>& place) {
  std::map<const void*, Weight> placed;  // by data as loaded
  absl::Status status;
  ForEachMatrix(w, [&](Weight& m) {
    if (m.empty() || !status.ok()) return;
    auto it = placed.find(m.tensor().data);
    if (it == placed.end()) {
      absl::StatusOr<Weight> moved = place(m);
      if (!moved.ok()) {
        status = moved.status();
        return;
      }
      it = placed.emplace(m.tensor().data, *std::move(moved)).first;
    }
    m = it->second;
  });
  return status;
}

// Copies every matrix and vector of `w` (host memory, as loaded) to the CUDA
// device. A matrix seen before (the head tied to the embedding) takes the
// same device copy.
absl::Status CopyWeightsToCuda(ModelWeights* w) {
  using kernels::Device;
  if (kernels::cuda::ActiveBackend() == kernels::cuda::Backend::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights on cuda: ", kernels::cuda::BackendProblem()));
  }
  kernels::Workspace& workspace = kernels::Workspace::Of(Device::kCuda);
  DELTASERVE_RETURN_IF_ERROR(PlaceEachMatrix(w, [&](const Weight& m) -> absl::StatusOr<Weight> {
    const kernels::Tensor& host = m.tensor();
    const size_t data_bytes = static_cast<size_t>(host.rows * host.RowBytes());
    const size_t scale_bytes = static_cast<size_t>(host.rows * host.ScaleRowBytes());
    auto block = std::make_shared<kernels::DeviceBlock>();
    const std::string error =
        kernels::DeviceBlock::Allocate(Device::kCuda, data_bytes + scale_bytes, block.get());
    if (!error.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "weights on cuda: ", data_bytes + scale_bytes, " bytes for a ",
          kernels::DTypeName(host.dtype), " [", host.rows, ", ", host.cols, "] matrix: ", error));
    }
    kernels::Tensor on = host;
    on.device = Device::kCuda;
    on.data = block->data();
    workspace.CopyFromHost(block->data(), host.data, data_bytes);
    if (scale_bytes > 0) {
      on.scales = static_cast<const uint8_t*>(block->data()) + data_bytes;
      workspace.CopyFromHost(static_cast<uint8_t*>(block->data()) + data_bytes, host.scales,
                             scale_bytes);
    }
    return Weight(on, std::move(block), /*mapped=*/false);
  }));
  ForEachVector(w, [](VectorWeight& v) { v.MoveTo(Device::kCuda); });
  if (const kernels::DeviceError error = workspace.Synchronize(); !error.ok()) {
    return absl::InternalError(
        absl::StrCat("weights on cuda: ", error.op, " failed: ", error.message));
  }
  return absl::OkStatus();
}

// Below this many bytes of matrices a model stays as loaded: a small one gains
// nothing, and the region's last huge page would be mostly empty.
constexpr size_t kHugePagesMinBytes = size_t{32} << 20;

// Moves every matrix of `w` (host memory, as loaded: views of the mapped
// checkpoint and the loader's copies) into one region on transparent huge
// pages, each at a 64-byte boundary; the loader's copies are freed, and the
// checkpoint's pages are Model::Load's to drop. Decode
// reads every active matrix once a token, and with 4 KiB pages the address
// translations, not the memory, set the pace on a virtual machine, whose TLB
// misses walk two page tables: on a 2-core KVM guest (Xeon, AVX-512) a
// threaded sum read 19.3 GB/s over 4 KiB pages and 34.2 GB/s over 2 MiB pages,
// and MXFP4 expert rows read in the order a decode step reads them 14 against
// 21 GB/s. A matrix seen before (the head tied to the embedding) takes the
// same place. Without transparent huge pages, or for a small model, nothing
// moves.
void MoveToHugePages(ModelWeights* w) {
  const auto align = [](size_t n) { return (n + 63) / 64 * 64; };
  std::map<const void*, size_t> sizes;  // by data: the matrix's bytes in the region
  ForEachMatrix(w, [&](Weight& m) {
    if (m.empty()) return;
    const kernels::Tensor& t = m.tensor();
    sizes.emplace(t.data, align(static_cast<size_t>(t.rows * t.RowBytes())) +
                              align(static_cast<size_t>(t.rows * t.ScaleRowBytes())));
  });
  size_t total = 0;
  for (const auto& [data, bytes] : sizes) total += bytes;
  if (total < kHugePagesMinBytes || !kernels::TransparentHugePages()) return;
  const std::shared_ptr<uint8_t> region = kernels::HugePageRegion(total);
  if (region == nullptr) return;
  size_t offset = 0;
  const absl::Status placed = PlaceEachMatrix(w, [&](const Weight& m) -> absl::StatusOr<Weight> {
    const kernels::Tensor& from = m.tensor();
    const size_t data_bytes = static_cast<size_t>(from.rows * from.RowBytes());
    const size_t scale_bytes = static_cast<size_t>(from.rows * from.ScaleRowBytes());
    kernels::Tensor to = from;
    uint8_t* const at = region.get() + offset;
    std::memcpy(at, from.data, data_bytes);
    to.data = at;
    if (scale_bytes > 0) {
      std::memcpy(at + align(data_bytes), from.scales, scale_bytes);
      to.scales = at + align(data_bytes);
    }
    offset += align(data_bytes) + align(scale_bytes);
    return Weight(to, std::shared_ptr<const void>(region, at), /*mapped=*/false);
  });
  DELTASERVE_CHECK(placed.ok());  // the copies cannot fail
}

}  // namespace

absl::Status PlaceWeights(ModelWeights* w, kernels::Device device, bool huge_pages) {
  if (device == kernels::Device::kCuda) return CopyWeightsToCuda(w);
  // What the loader made is host memory: mapped views and its own copies of
  // matrices, and the vectors' Buffers.
  absl::Status status;
  auto check = [&](kernels::Device on, const char* what) {
    if (on != device && status.ok()) {
      status = absl::InternalError(absl::StrCat("a ", kernels::DeviceName(on), " ", what, " where ",
                                                kernels::DeviceName(device), " was asked"));
    }
  };
  ForEachMatrix(w, [&](Weight& m) {
    if (!m.empty()) check(m.tensor().device, "weight");
  });
  ForEachVector(w, [&](VectorWeight& v) {
    if (!v.empty()) check(v.device(), "vector weight");
  });
  if (status.ok() && huge_pages) MoveToHugePages(w);
  return status;
}

WeightBytes CountWeightBytes(const ModelWeights& w) {
  WeightBytes out;
  ForEachMatrix(w, [&out](const Weight& m) {
    if (m.empty()) return;
    out.by_dtype[kernels::DTypeName(m.tensor().dtype)] += m.bytes();
    (m.mapped() ? out.mapped : out.copied) += m.bytes();
  });
  int64_t vectors = 0;
  ForEachVector(w, [&vectors](const VectorWeight& v) { vectors += v.bytes(); });
  if (vectors > 0) out.by_dtype["f32 vectors"] = vectors;
  return out;
}

}  // namespace deltaserve
