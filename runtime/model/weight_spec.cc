#include "runtime/model/weight_spec.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "kernels/mxfp4.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/arch/architecture.h"

namespace deltaserve {
namespace {

void AddKda(const ModelConfig& c, const ModelArchitecture& arch, const std::string& p,
            SpecList* s) {
  const int64_t D = c.hidden_size;
  const int64_t H = c.kda.num_heads;
  const int64_t d = c.kda.head_dim;
  const int64_t HD = H * d;
  const int64_t K = c.kda.conv_kernel_size;
  const std::string a = p + "self_attn.";
  // Split by heads; the low-rank gate inputs and the per-head norm, which
  // every head reads, are replicated.
  const TpSplit heads = TpSplit::Rows(TpDim::kKdaHeads);
  for (const char* x : {"q", "k", "v"}) {
    s->Add(a + x + "_proj.weight", {HD, D}, heads);
    s->Add(a + x + "_conv1d.weight", {HD, 1, K}, DType::kF32, heads);  // depthwise
  }
  s->Add(a + "f_a_proj.weight", {d, D});  // decay gate, low rank d
  s->Add(a + "f_b_proj.weight", {HD, d}, heads);
  s->Add(a + "b_proj.weight", {H, D}, heads);  // beta, one per head
  s->Add(a + "A_log", arch.ALogShape(H), DType::kF32, TpSplit::Leading(TpDim::kKdaHeads, H));
  s->Add(a + "dt_bias", {HD}, DType::kF32, heads);
  if (c.kda.full_rank_gate) {
    s->Add(a + "g_proj.weight", {HD, D}, heads);
  } else {
    s->Add(a + "g_a_proj.weight", {d, D});
    s->Add(a + "g_b_proj.weight", {HD, d}, heads);
  }
  s->Add(a + "o_norm.weight", {d}, DType::kF32);  // per-head RMSNorm
  s->Add(a + "o_proj.weight", {D, HD}, TpSplit::Columns(TpDim::kKdaHeads));
}

void AddMla(const ModelConfig& c, const std::string& p, SpecList* s) {
  const int64_t D = c.hidden_size;
  const int64_t n = c.num_attention_heads;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const std::string a = p + "self_attn.";
  // Split by heads; the latent (shared by all heads) and the q-LoRA input
  // are replicated.
  const TpSplit heads = TpSplit::Rows(TpDim::kMlaHeads);
  if (c.q_lora_rank > 0) {
    s->Add(a + "q_a_proj.weight", {c.q_lora_rank, D});
    s->Add(a + "q_a_layernorm.weight", {c.q_lora_rank});
    s->Add(a + "q_b_proj.weight", {n * qk, c.q_lora_rank}, heads);
  } else {
    s->Add(a + "q_proj.weight", {n * qk, D}, heads);
  }
  // [latent C | shared key part R]
  s->Add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, D});
  s->Add(a + "kv_a_layernorm.weight", {c.kv_lora_rank});
  s->Add(a + "kv_b_proj.weight", {n * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, heads);
  if (c.mla_output_gate) s->Add(a + "g_proj.weight", {n * c.v_head_dim, D}, heads);
  s->Add(a + "o_proj.weight", {D, n * c.v_head_dim}, TpSplit::Columns(TpDim::kMlaHeads));
}

// A gated MLP of `width` split by it: gate/up rows, down columns.
void AddGatedMlp(const std::string& p, int64_t D, int64_t width, TpDim dim, SpecList* s) {
  s->Add(p + "gate_proj.weight", {width, D}, TpSplit::Rows(dim));
  s->Add(p + "up_proj.weight", {width, D}, TpSplit::Rows(dim));
  s->Add(p + "down_proj.weight", {D, width}, TpSplit::Columns(dim));
}

void AddFfn(const ModelConfig& c, int64_t layer, const std::string& p, SpecList* s) {
  const int64_t D = c.hidden_size;
  if (!c.IsMoeLayer(layer)) {
    AddGatedMlp(p + "mlp.", D, c.intermediate_size, TpDim::kDenseWidth, s);
    return;
  }
  const std::string m = p + "block_sparse_moe.";
  const int64_t E = c.num_experts;
  const int64_t I = c.moe_intermediate_size;
  // Routed experts work in the latent space when there is one.
  const int64_t Z = c.routed_expert_hidden_size > 0 ? c.routed_expert_hidden_size : D;
  // The router is replicated: every rank computes the same selection.
  s->Add(m + "gate.weight", {E, D});
  s->Add(m + "gate.e_score_correction_bias", {E}, DType::kF32);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = absl::StrCat(m, "experts.", e, ".");
    s->Add(x + "w1.weight", {I, Z}, TpSplit::Expert(e));
    s->Add(x + "w3.weight", {I, Z}, TpSplit::Expert(e));
    s->Add(x + "w2.weight", {Z, I}, TpSplit::Expert(e));
  }
  if (c.num_shared_experts > 0) {
    AddGatedMlp(m + "shared_experts.", D, c.num_shared_experts * I, TpDim::kSharedExpertWidth, s);
  }
  if (c.routed_expert_hidden_size > 0) {  // latent MoE: replicated down / up
    s->Add(m + "routed_expert_down_proj.weight", {Z, D});
    s->Add(m + "routed_expert_up_proj.weight", {D, Z});
    if (c.latent_moe_use_norm) s->Add(m + "routed_expert_norm.weight", {Z});
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The module a weight belongs to, as quantization_config names modules.
std::string ModuleOf(const TensorSpec& spec) {
  return std::string(absl::StripSuffix(spec.name, ".weight"));
}

bool IsRoutedExpert(const TensorSpec& spec) { return spec.split.cut == TpCut::kExpert; }

// [out, in / 2] codes and [out, in / 32] scales of an MXFP4 [out, in].
std::vector<int64_t> PackedShape(const TensorSpec& spec) {
  return {spec.shape[0], spec.shape[1] / 2};
}
std::vector<int64_t> ScaleShape(const TensorSpec& spec) {
  return {spec.shape[0], spec.shape[1] / kernels::kMxfp4Group};
}

// The checks of one routed expert stored as MXFP4 (at least one half present,
// no float form), each problem passed to `problem`.
template <typename Problem>
void CheckMxfp4Pair(const ModelConfig& config, const QuantizationMatcher& matcher,
                    const TensorSpec& spec, const TensorView* packed, const TensorView* scale,
                    Problem&& problem) {
  const TensorView& present = packed != nullptr ? *packed : *scale;
  const std::string what =
      absl::StrCat("tensor '", present.name, "' in ", present.file, " is MXFP4, but ");
  const QuantizationConfig& q = config.quantization;
  const QuantizationMatcher::Match match = matcher.Of(ModuleOf(spec));
  switch (match.verdict) {
    case QuantizationMatcher::Verdict::kPlain:
      problem(absl::StrCat(what, "the config has no quantization_config"));
      break;
    case QuantizationMatcher::Verdict::kUntargeted:
      problem(absl::StrCat(what, "module '", ModuleOf(spec), "' matches no target of ", q.key, " (",
                           absl::StrJoin(q.targets, ", "), ")"));
      break;
    case QuantizationMatcher::Verdict::kIgnored:
      problem(absl::StrCat(what, "module '", ModuleOf(spec), "' is in ", q.key, ".ignore ('",
                           match.ignored_by, "')"));
      break;
    case QuantizationMatcher::Verdict::kMxfp4:
      break;
  }
  const int64_t in = spec.shape[1];
  if (in % kernels::kMxfp4Group != 0) {
    problem(absl::StrCat(what, "its rows of ", in, " values (shape ", ShapeString(spec.shape),
                         ") do not split into groups of ", kernels::kMxfp4Group));
    return;
  }
  struct Half {
    const char* role;
    std::string name;
    const TensorView* view;
    std::vector<int64_t> shape;
  };
  for (const Half& half : {Half{"codes", spec.PackedName(), packed, PackedShape(spec)},
                           Half{"scales", spec.ScaleName(), scale, ScaleShape(spec)}}) {
    const std::string expected =
        absl::StrCat("U8 ", ShapeString(half.shape), ", the ", half.role, " of MXFP4 '", spec.name,
                     "' ", ShapeString(spec.shape));
    if (half.view == nullptr) {
      problem(absl::StrCat("missing tensor '", half.name, "' (", expected, "; ", present.file,
                           " holds '", present.name, "')"));
    } else if (half.view->dtype != DType::kU8) {
      problem(absl::StrCat("tensor '", half.name, "' in ", half.view->file, " has dtype ",
                           DTypeName(half.view->dtype), ", expected ", expected));
    } else if (half.view->shape != half.shape) {
      problem(absl::StrCat("tensor '", half.name, "' in ", half.view->file, " has shape ",
                           ShapeString(half.view->shape), ", expected ", expected));
    }
  }
}

// Every tensor in its float form (ExpectedTensors then marks MXFP4 experts).
std::vector<TensorSpec> FloatLayout(const ModelConfig& c) {
  const ModelArchitecture& arch = ArchitectureOf(c);
  std::vector<TensorSpec> out;
  SpecList s(&out);
  const std::string prefix = c.ModelPrefix();
  const int64_t D = c.hidden_size;
  s.Begin(ModelPart::kEmbedding);
  s.Add(prefix + "embed_tokens.weight", {c.vocab_size, D});
  s.Begin(ModelPart::kHead);
  s.Add(prefix + "norm.weight", {D});
  if (!c.tie_word_embeddings) s.Add(c.LmHeadName(), {c.vocab_size, D});
  arch.AddHeadTensors(c, &s);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat(prefix, "layers.", i, ".");
    s.Begin(ModelPart::kLayer, i);
    s.Add(p + "input_layernorm.weight", {D});
    s.Add(p + "post_attention_layernorm.weight", {D});
    arch.AddLayerTensors(c, p, &s);
    if (c.layer_kinds[static_cast<size_t>(i)] == LayerKind::kKda) {
      AddKda(c, arch, p, &s);
    } else {
      AddMla(c, p, &s);
    }
    AddFfn(c, i, p, &s);
  }
  return out;
}

}  // namespace

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void SpecList::Add(std::string name, std::vector<int64_t> shape, DType dtype, TpSplit split) {
  out_->push_back(TensorSpec{std::move(name), std::move(shape), dtype, part_, layer_, split});
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  std::vector<TensorSpec> out = FloatLayout(c);
  if (!c.quantization.mxfp4) return out;
  // A config that did not come from ParseModelConfig may hold a pattern that
  // does not compile: it selects nothing here, and CheckpointTensors says why.
  const absl::StatusOr<QuantizationMatcher> matcher = QuantizationMatcher::Create(c.quantization);
  if (!matcher.ok()) return out;
  for (TensorSpec& spec : out) {
    if (IsRoutedExpert(spec) &&
        matcher->Of(ModuleOf(spec)).verdict == QuantizationMatcher::Verdict::kMxfp4) {
      spec.stored = Storage::kMxfp4;
    }
  }
  return out;
}

ParameterCount CountParameters(const ModelConfig& c) {
  ParameterCount count;
  for (const TensorSpec& spec : ExpectedTensors(c)) {
    const int64_t n = spec.NumElements();
    count.total += n;
    if (spec.split.cut == TpCut::kExpert) {
      continue;  // routed experts: added below at the per-token share
    }
    count.active_per_token += n;
  }
  // Each MoE layer runs num_experts_per_token of its routed experts.
  const int64_t Z = c.routed_expert_hidden_size > 0 ? c.routed_expert_hidden_size : c.hidden_size;
  const int64_t per_expert = 3 * Z * c.moe_intermediate_size;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.IsMoeLayer(i)) count.active_per_token += c.num_experts_per_token * per_expert;
  }
  return count;
}

int64_t StoredBytes(const TensorSpec& spec, int64_t elements) {
  if (spec.stored == Storage::kFloat) {
    return elements * static_cast<int64_t>(DTypeSize(spec.dtype));
  }
  const int64_t in = spec.shape.back();
  const int64_t rows = in > 0 ? elements / in : 0;
  return rows * ((in + 1) / 2 + (in + kernels::kMxfp4Group - 1) / kernels::kMxfp4Group);
}

bool HeldAsMatrix(const TensorSpec& spec) { return spec.shape.size() == 2 && spec.shape[0] > 1; }

int64_t HeldBytes(const TensorSpec& spec, int64_t elements) {
  return HeldAsMatrix(spec) ? StoredBytes(spec, elements) : elements * 4;
}

absl::StatusOr<std::vector<TensorSpec>> CheckpointTensors(const ModelConfig& config,
                                                          const Checkpoint& checkpoint) {
  // Compiled once for the whole model; the error of a hand-made config whose
  // pattern does not compile names the entry.
  auto matcher = QuantizationMatcher::Create(config.quantization);
  if (!matcher.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        checkpoint.dir(), ": its config cannot be matched: ", matcher.status().message()));
  }
  constexpr size_t kMaxListed = 8;
  std::vector<std::string> problems;
  size_t total = 0;
  auto problem = [&](std::string text) {
    if (problems.size() < kMaxListed) problems.push_back(std::move(text));
    ++total;
  };
  auto find = [&](const std::string& name) -> const TensorView* {
    auto it = checkpoint.tensors().find(name);
    return it == checkpoint.tensors().end() ? nullptr : it->second;
  };
  std::vector<TensorSpec> specs = ExpectedTensors(config);
  for (TensorSpec& spec : specs) {
    const TensorView* whole = find(spec.name);
    const TensorView* packed = find(spec.PackedName());
    const TensorView* scale = find(spec.ScaleName());
    spec.stored = Storage::kFloat;
    if (packed != nullptr || scale != nullptr) {
      const TensorView& present = packed != nullptr ? *packed : *scale;
      if (!IsRoutedExpert(spec)) {
        // Only routed experts may be MXFP4; say so rather than "missing".
        if (whole == nullptr) {
          problem(absl::StrCat("missing tensor '", spec.name, "' (shape ", ShapeString(spec.shape),
                               "): ", present.file, " holds '", present.name,
                               "', but only routed experts may be MXFP4"));
          continue;
        }
      } else if (whole != nullptr) {
        problem(absl::StrCat("tensor '", spec.name, "' is stored twice: as ",
                             DTypeName(whole->dtype), " in ", whole->file, " and as MXFP4 '",
                             present.name, "' in ", present.file));
        continue;
      } else {
        CheckMxfp4Pair(config, *matcher, spec, packed, scale, problem);
        spec.stored = Storage::kMxfp4;
        continue;
      }
    }
    if (whole == nullptr) {
      problem(
          absl::StrCat("missing tensor '", spec.name, "' (shape ", ShapeString(spec.shape), ")"));
      continue;
    }
    const TensorView& view = *whole;
    if (view.dtype != DType::kF32 && view.dtype != DType::kBF16 && view.dtype != DType::kF16) {
      problem(absl::StrCat("tensor '", spec.name, "' in ", view.file, " has dtype ",
                           DTypeName(view.dtype), ", expected F32, BF16 or F16"));
      continue;
    }
    if (spec.split.cut == TpCut::kLeading) {
      // Only the leading values (one per head) are read, whatever the layout.
      if (view.NumElements() < spec.split.leading) {
        problem(absl::StrCat("tensor '", spec.name, "' in ", view.file, " has shape ",
                             ShapeString(view.shape), " (", view.NumElements(),
                             " values), expected at least ", spec.split.leading,
                             " (one per head)"));
      }
      continue;
    }
    if (view.shape != spec.shape) {
      problem(absl::StrCat("tensor '", spec.name, "' in ", view.file, " has shape ",
                           ShapeString(view.shape), ", expected ", ShapeString(spec.shape)));
    }
  }
  if (total == 0) return specs;
  const std::string model_type = !config.model_type.empty()
                                     ? config.model_type
                                     : std::string(ArchitectureOf(config).model_type());
  std::string message = absl::StrCat(checkpoint.dir(), ": checkpoint does not match its ",
                                     model_type, " config: ", absl::StrJoin(problems, "; "));
  if (total > problems.size()) {
    absl::StrAppend(&message, "; and ", total - problems.size(), " more");
  }
  // The first problem decides the code: NotFound for a missing tensor,
  // InvalidArgument for a present but wrong one.
  const bool first_missing = absl::StartsWith(problems.front(), "missing");
  return first_missing ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
}

absl::Status ValidateCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint) {
  return CheckpointTensors(config, checkpoint).status();
}

absl::StatusOr<Mxfp4Views> GetMxfp4(const Checkpoint& checkpoint, const TensorSpec& spec) {
  if (spec.stored != Storage::kMxfp4) {
    return absl::InvalidArgumentError(
        absl::StrCat(checkpoint.dir(), ": tensor '", spec.name,
                     "' is not MXFP4 in its spec (take the specs from CheckpointTensors)"));
  }
  Mxfp4Views views;
  DELTASERVE_ASSIGN_OR_RETURN(views.packed, checkpoint.Get(spec.PackedName()));
  DELTASERVE_ASSIGN_OR_RETURN(views.scale, checkpoint.Get(spec.ScaleName()));
  // Defence against a checkpoint that did not pass CheckpointTensors: the
  // bytes read below must be there.
  if (spec.shape.size() != 2 || spec.shape[1] % kernels::kMxfp4Group != 0 ||
      views.packed->dtype != DType::kU8 || views.scale->dtype != DType::kU8 ||
      views.packed->shape != PackedShape(spec) || views.scale->shape != ScaleShape(spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        checkpoint.dir(), ": MXFP4 tensor '", spec.name,
        "' does not have the shapes of its spec (check it with CheckpointTensors first)"));
  }
  const int64_t nan = kernels::FindNanScale(views.scale->data, views.scale->NumElements());
  if (nan >= 0) {
    const int64_t groups = ScaleShape(spec)[1];
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", spec.ScaleName(), "' in ", views.scale->file, " has a NaN scale (255) at row ",
        nan / groups, ", group ", nan % groups, " (columns ", nan % groups * kernels::kMxfp4Group,
        "..", (nan % groups + 1) * kernels::kMxfp4Group - 1, ")"));
  }
  return views;
}

}  // namespace deltaserve
