#include "runtime/model/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/checked_product.h"
#include "runtime/common/file_util.h"
#include "runtime/common/json_bounds.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/arch/architecture.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// No real dimension comes near this; it keeps every product of two sizes
// (tensor element counts) far from int64 overflow.
constexpr int64_t kMaxSize = int64_t{1} << 24;
// Counts that multiply the number of tensors; real models have 93 layers and
// 384 experts.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxExperts = 65536;

// Typed access to one JSON object of config.json. `path` is the key path of
// the object ("", "text_config.", "text_config.linear_attn_config."), so
// every error names the full key path and the file.
class ConfigObject {
 public:
  ConfigObject(const json* object, std::string path, const std::string* source)
      : object_(object), path_(std::move(path)), source_(source) {}

  bool Contains(const std::string& key) const { return object_->contains(key); }
  // Present and not null.
  bool Has(const std::string& key) const {
    return object_->contains(key) && !(*object_)[key].is_null();
  }
  std::string Path(const std::string& key) const { return path_ + key; }

  absl::Status Missing(const std::string& key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(*source_, ": missing required key '", Path(key), "'"));
  }
  absl::Status Bad(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(*source_, ": key '", Path(key), "' ", what));
  }

  // An integer in [min, max].
  absl::StatusOr<int64_t> Int(const std::string& key, int64_t min, int64_t max = kMaxSize) const {
    if (!Has(key)) return Missing(key);
    return IntValue(key, (*object_)[key], min, max);
  }
  absl::StatusOr<int64_t> IntOr(const std::string& key, int64_t min, int64_t fallback) const {
    if (!Has(key)) return fallback;
    return IntValue(key, (*object_)[key], min, kMaxSize);
  }
  // A number (integer or floating-point literal) held as float32: finite,
  // and zero or of normal float magnitude, so that the float keeps the sign
  // checked here and is itself again when written back (1e-50 would become
  // 0, 1e39 infinity).
  absl::StatusOr<float> Float(const std::string& key) const {
    if (!Has(key)) return Missing(key);
    const json& json_value = (*object_)[key];
    if (!json_value.is_number()) return Bad(key, "must be a number, got " + Dump(json_value));
    const double value = json_value.get<double>();
    const double magnitude = std::fabs(value);
    if (!(magnitude <= std::numeric_limits<float>::max())) {
      return Bad(key, absl::StrCat("is ", value, ", outside the float32 range"));
    }
    if (magnitude != 0 && magnitude < std::numeric_limits<float>::min()) {
      return Bad(key, absl::StrCat("is ", value, ", too small for a float32 (at least ",
                                   std::numeric_limits<float>::min(), " in magnitude)"));
    }
    return static_cast<float>(value);
  }
  absl::StatusOr<bool> Bool(const std::string& key) const {
    if (!Has(key)) return Missing(key);
    const json& value = (*object_)[key];
    if (!value.is_boolean()) {
      return Bad(key, "must be true or false, got " + Dump(value));
    }
    return value.get<bool>();
  }
  absl::StatusOr<bool> BoolOr(const std::string& key, bool fallback) const {
    if (!Has(key)) return fallback;
    return Bool(key);
  }
  absl::StatusOr<std::string> String(const std::string& key) const {
    if (!Has(key)) return Missing(key);
    const json& value = (*object_)[key];
    if (!value.is_string()) return Bad(key, "must be a string, got " + Dump(value));
    return value.get<std::string>();
  }
  // A list of strings (quantization targets).
  absl::StatusOr<std::vector<std::string>> StringList(const std::string& key) const {
    if (!Has(key)) return Missing(key);
    const json& value = (*object_)[key];
    if (!value.is_array()) return Bad(key, "must be a list of strings, got " + Dump(value));
    std::vector<std::string> out;
    for (const json& item : value) {
      if (!item.is_string()) return Bad(key, "must be a list of strings, has " + Dump(item));
      out.push_back(item.get<std::string>());
    }
    return out;
  }
  // The object's keys, sorted (nlohmann::json keeps an object in a std::map).
  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    for (auto it = object_->begin(); it != object_->end(); ++it) keys.push_back(it.key());
    return keys;
  }
  const json& Value(const std::string& key) const { return (*object_)[key]; }
  absl::StatusOr<ConfigObject> Object(const std::string& key) const {
    if (!Has(key)) return Missing(key);
    const json& value = (*object_)[key];
    if (!value.is_object()) return Bad(key, "must be an object");
    return ConfigObject(&value, Path(key) + ".", source_);
  }
  // A list of integers (layer numbers), each in [min, max].
  absl::StatusOr<std::vector<int64_t>> IntList(const std::string& key) const {
    if (!object_->contains(key)) return Missing(key);
    const json& value = (*object_)[key];
    if (!value.is_array()) return Bad(key, "must be a list of layer numbers");
    std::vector<int64_t> out;
    for (const json& item : value) {
      if (!item.is_number_integer()) {
        return Bad(key, "must be a list of integers, has " + Dump(item));
      }
      out.push_back(item.get<int64_t>());
    }
    return out;
  }

 private:
  static std::string Dump(const json& value) {
    std::string text = value.dump();
    if (text.size() > 40) text = text.substr(0, 37) + "...";
    return text;
  }
  absl::StatusOr<int64_t> IntValue(const std::string& key, const json& value, int64_t min,
                                   int64_t max) const {
    if (!value.is_number_integer()) {
      return Bad(key, "must be an integer, got " + Dump(value));
    }
    if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(max)) {
      return Bad(key, absl::StrCat("is too large (at most ", max, ")"));
    }
    const int64_t v = value.get<int64_t>();
    if (v < min) return Bad(key, absl::StrCat("must be at least ", min, ", got ", v));
    if (v > max) return Bad(key, absl::StrCat("is too large (at most ", max, ")"));
    return v;
  }

  const json* object_;
  std::string path_;
  const std::string* source_;
};

// Fills config->layer_kinds from the two 1-indexed layer lists.
absl::Status ParseLayerLists(const ConfigObject& lin, const std::string& source,
                             ModelConfig* config) {
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<int64_t> kda, lin.IntList("kda_layers"));
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<int64_t> mla, lin.IntList("full_attn_layers"));
  const int64_t n = config->num_layers;
  // 0: unassigned, 1: KDA, 2: MLA.
  std::vector<int> assigned(static_cast<size_t>(n), 0);
  auto assign = [&](const std::vector<int64_t>& list, const std::string& key,
                    int kind) -> absl::Status {
    for (int64_t layer : list) {
      if (layer < 1 || layer > n) {
        return lin.Bad(
            key, absl::StrCat("names layer ", layer, ", outside 1..", n,
                              " (the layer lists are 1-indexed; num_hidden_layers is ", n, ")"));
      }
      int& slot = assigned[static_cast<size_t>(layer - 1)];
      if (slot == kind) {
        return lin.Bad(key, absl::StrCat("lists layer ", layer, " twice"));
      }
      if (slot != 0) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": layer ", layer, " is in both '",
                                                       lin.Path("kda_layers"), "' and '",
                                                       lin.Path("full_attn_layers"), "'"));
      }
      slot = kind;
    }
    return absl::OkStatus();
  };
  DELTASERVE_RETURN_IF_ERROR(assign(kda, "kda_layers", 1));
  DELTASERVE_RETURN_IF_ERROR(assign(mla, "full_attn_layers", 2));
  config->layer_kinds.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (assigned[static_cast<size_t>(i)] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": layer ", i + 1, " (1-indexed) is in neither '",
                       lin.Path("kda_layers"), "' nor '", lin.Path("full_attn_layers"), "' (",
                       kda.size(), " + ", mla.size(), " entries for ", n, " layers)"));
    }
    config->layer_kinds.push_back(assigned[static_cast<size_t>(i)] == 1 ? LayerKind::kKda
                                                                        : LayerKind::kMla);
  }
  return absl::OkStatus();
}

absl::Status ParseMoe(const ConfigObject& t, ModelConfig* c) {
  DELTASERVE_ASSIGN_OR_RETURN(c->num_experts, t.Int("num_experts", 0, kMaxExperts));
  DELTASERVE_ASSIGN_OR_RETURN(c->first_k_dense_replace, t.Int("first_k_dense_replace", 0));
  if (c->first_k_dense_replace > c->num_layers) {
    return t.Bad("first_k_dense_replace",
                 absl::StrCat("is ", c->first_k_dense_replace, ", more than num_hidden_layers (",
                              c->num_layers, ")"));
  }
  if (c->num_experts == 0) return absl::OkStatus();  // dense FFN everywhere
  DELTASERVE_ASSIGN_OR_RETURN(c->num_experts_per_token, t.Int("num_experts_per_token", 1));
  if (c->num_experts_per_token > c->num_experts) {
    return t.Bad("num_experts_per_token",
                 absl::StrCat("is ", c->num_experts_per_token, ", more than num_experts (",
                              c->num_experts, ")"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(c->moe_intermediate_size, t.Int("moe_intermediate_size", 1));
  DELTASERVE_ASSIGN_OR_RETURN(c->num_shared_experts, t.Int("num_shared_experts", 0));
  DELTASERVE_ASSIGN_OR_RETURN(c->moe_renormalize, t.Bool("moe_renormalize"));
  DELTASERVE_ASSIGN_OR_RETURN(c->routed_scaling_factor, t.Float("routed_scaling_factor"));
  if (!(c->routed_scaling_factor > 0)) return t.Bad("routed_scaling_factor", "must be positive");
  // Routing variants the runtime does not implement are errors, not silently
  // different models.
  if (t.Has("moe_router_activation_func")) {
    DELTASERVE_ASSIGN_OR_RETURN(std::string act, t.String("moe_router_activation_func"));
    if (act != "sigmoid") {
      return t.Bad("moe_router_activation_func", "is '" + act + "'; only 'sigmoid' is supported");
    }
  }
  DELTASERVE_ASSIGN_OR_RETURN(int64_t freq, t.IntOr("moe_layer_freq", 1, 1));
  if (freq != 1) {
    return t.Bad("moe_layer_freq", absl::StrCat("is ", freq, "; only 1 is supported"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(bool grouped, t.BoolOr("use_grouped_topk", false));
  if (grouped) {
    DELTASERVE_ASSIGN_OR_RETURN(int64_t groups, t.IntOr("num_expert_group", 1, 1));
    DELTASERVE_ASSIGN_OR_RETURN(int64_t topk_group, t.IntOr("topk_group", 1, groups));
    if (topk_group < groups) {
      return t.Bad("topk_group", absl::StrCat("is ", topk_group, " of ", groups,
                                              " expert groups; group-limited routing is not "
                                              "supported"));
    }
  }
  return absl::OkStatus();
}

constexpr char kMxfp4Format[] = "mxfp4-pack-quantized";

// One config group of a quantization_config: MXFP4 weights, nothing else.
// `format` is the block's top-level format, for a group that names none.
absl::Status ParseQuantizationGroup(const ConfigObject& g, const ConfigObject& q,
                                    const std::string* format, QuantizationConfig* out) {
  if (g.Has("format")) {
    DELTASERVE_ASSIGN_OR_RETURN(std::string group_format, g.String("format"));
    if (group_format != kMxfp4Format) {
      return g.Bad("format", absl::StrCat("is '", group_format, "'; only '", kMxfp4Format,
                                          "' (MXFP4 weights) is supported"));
    }
  } else if (format == nullptr) {
    return g.Bad("format", absl::StrCat("is missing, and so is '", q.Path("format"),
                                        "'; expected '", kMxfp4Format, "'"));
  } else if (*format != kMxfp4Format) {
    return q.Bad("format", absl::StrCat("is '", *format, "'; only '", kMxfp4Format,
                                        "' (MXFP4 weights) is supported"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(ConfigObject w, g.Object("weights"));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t bits, w.Int("num_bits", 0));
  if (bits != 4) {
    return w.Bad("num_bits", absl::StrCat("is ", bits, "; only MXFP4 (4-bit floats) is supported"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(std::string type, w.String("type"));
  if (type != "float") {
    return w.Bad("type", absl::StrCat("is '", type, "'; only MXFP4 ('float') is supported"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(int64_t group_size, w.Int("group_size", 0));
  if (group_size != 32) {
    return w.Bad("group_size",
                 absl::StrCat("is ", group_size, "; only MXFP4 with groups of 32 is supported"));
  }
  // Optional, but when given they must describe MXFP4: one shared scale per
  // group, no zero point, scales stored rather than computed at run time.
  if (w.Has("strategy")) {
    DELTASERVE_ASSIGN_OR_RETURN(std::string strategy, w.String("strategy"));
    if (strategy != "group") {
      return w.Bad("strategy", absl::StrCat("is '", strategy, "'; MXFP4 scales are per 'group'"));
    }
  }
  if (w.Has("symmetric")) {
    DELTASERVE_ASSIGN_OR_RETURN(bool symmetric, w.Bool("symmetric"));
    if (!symmetric) return w.Bad("symmetric", "is false; MXFP4 has no zero point");
  }
  if (w.Has("dynamic")) {
    DELTASERVE_ASSIGN_OR_RETURN(bool dynamic, w.Bool("dynamic"));
    if (dynamic) return w.Bad("dynamic", "is true; MXFP4 weights carry stored scales");
  }
  // Quantized activations would make a different model, silently: refuse.
  for (const char* key : {"input_activations", "output_activations"}) {
    if (g.Has(key)) {
      return g.Bad(key, "is set; only weights may be quantized (activations stay bf16 / f32)");
    }
  }
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<std::string> targets, g.StringList("targets"));
  if (targets.empty()) return g.Bad("targets", "is empty; a group must target some modules");
  for (size_t i = 0; i < targets.size(); ++i) {
    if (absl::Status s = CheckQuantizationEntry(targets[i]); !s.ok()) {
      return g.Bad("targets", absl::StrCat("entry ", i, ": ", s.message()));
    }
  }
  out->targets.insert(out->targets.end(), targets.begin(), targets.end());
  return absl::OkStatus();
}

// compressed-tensors' quantization_config (quantization.h), from object `q`.
absl::StatusOr<QuantizationConfig> ParseQuantization(const ConfigObject& q) {
  QuantizationConfig out;
  out.key = q.Path("");
  out.key.pop_back();  // the trailing '.'
  DELTASERVE_ASSIGN_OR_RETURN(std::string method, q.String("quant_method"));
  if (method != "compressed-tensors") {
    return q.Bad("quant_method",
                 absl::StrCat("is '", method, "'; only 'compressed-tensors' (MXFP4) is supported"));
  }
  std::optional<std::string> format;
  if (q.Has("format")) {
    DELTASERVE_ASSIGN_OR_RETURN(format, q.String("format"));
  }
  if (q.Has("kv_cache_scheme")) {
    return q.Bad("kv_cache_scheme", "is set; a quantized KV cache is not supported");
  }
  DELTASERVE_ASSIGN_OR_RETURN(ConfigObject groups, q.Object("config_groups"));
  const std::vector<std::string> names = groups.Keys();
  if (names.empty()) return q.Bad("config_groups", "is empty; expected a group of MXFP4 weights");
  for (const std::string& name : names) {
    DELTASERVE_ASSIGN_OR_RETURN(ConfigObject group, groups.Object(name));
    DELTASERVE_RETURN_IF_ERROR(ParseQuantizationGroup(group, q, format ? &*format : nullptr, &out));
  }
  if (q.Has("ignore")) {
    DELTASERVE_ASSIGN_OR_RETURN(out.ignore, q.StringList("ignore"));
    for (size_t i = 0; i < out.ignore.size(); ++i) {
      if (absl::Status s = CheckQuantizationEntry(out.ignore[i]); !s.ok()) {
        return q.Bad("ignore", absl::StrCat("entry ", i, ": ", s.message()));
      }
    }
  }
  out.mxfp4 = true;
  return out;
}

// K3 checkpoints write quantization_config under text_config (the golden
// files), transformers' wrappers at the top level: either is read, and both
// only when they say the same.
absl::Status ParseQuantizationOf(const ConfigObject& top, const ConfigObject* text,
                                 const std::string& source, ModelConfig* c) {
  constexpr char kKey[] = "quantization_config";
  const bool in_text = text != nullptr && text->Has(kKey);
  if (in_text && top.Has(kKey) && text->Value(kKey) != top.Value(kKey)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": '", top.Path(kKey), "' and '", text->Path(kKey),
                     "' differ; give one quantization_config (either place is read)"));
  }
  const ConfigObject& where = in_text ? *text : top;
  if (!where.Has(kKey)) return absl::OkStatus();  // plain bf16 / f32
  DELTASERVE_ASSIGN_OR_RETURN(ConfigObject q, where.Object(kKey));
  DELTASERVE_ASSIGN_OR_RETURN(c->quantization, ParseQuantization(q));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseFields(const ConfigObject& t, const std::string& source,
                                        ModelConfig c) {
  const bool k3 = c.IsK3();
  DELTASERVE_ASSIGN_OR_RETURN(c.hidden_size, t.Int("hidden_size", 1));
  DELTASERVE_ASSIGN_OR_RETURN(c.num_layers, t.Int("num_hidden_layers", 1, kMaxLayers));
  DELTASERVE_ASSIGN_OR_RETURN(c.vocab_size, t.Int("vocab_size", 1));
  DELTASERVE_ASSIGN_OR_RETURN(c.rms_norm_eps, t.Float("rms_norm_eps"));
  if (!(c.rms_norm_eps > 0)) return t.Bad("rms_norm_eps", "must be positive");
  DELTASERVE_ASSIGN_OR_RETURN(c.max_position_embeddings, t.IntOr("max_position_embeddings", 1, 0));
  DELTASERVE_ASSIGN_OR_RETURN(c.tie_word_embeddings, t.BoolOr("tie_word_embeddings", false));

  // KDA.
  DELTASERVE_ASSIGN_OR_RETURN(ConfigObject lin, t.Object("linear_attn_config"));
  DELTASERVE_ASSIGN_OR_RETURN(c.kda.num_heads, lin.Int("num_heads", 1));
  DELTASERVE_ASSIGN_OR_RETURN(c.kda.head_dim, lin.Int("head_dim", 1));
  if (k3) {
    DELTASERVE_ASSIGN_OR_RETURN(c.kda.conv_kernel_size, lin.Int("short_conv_kernel_size", 1));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(c.kda.conv_kernel_size, lin.IntOr("short_conv_kernel_size", 1, 4));
  }
  DELTASERVE_RETURN_IF_ERROR(ParseLayerLists(lin, source, &c));
  // The K3 gate keys live in linear_attn_config; accept them one level up
  // too, but name the linear_attn_config path when they are missing.
  const ConfigObject& gate_keys =
      (!lin.Has("use_full_rank_gate") && t.Has("use_full_rank_gate")) ? t : lin;
  const ConfigObject& bound_keys =
      (!lin.Has("gate_lower_bound") && t.Has("gate_lower_bound")) ? t : lin;
  if (k3) {
    DELTASERVE_ASSIGN_OR_RETURN(c.kda.full_rank_gate, gate_keys.Bool("use_full_rank_gate"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(c.kda.full_rank_gate,
                                gate_keys.BoolOr("use_full_rank_gate", false));
  }
  c.kda.has_lower_bound = k3 || bound_keys.Has("gate_lower_bound");
  if (c.kda.has_lower_bound) {
    DELTASERVE_ASSIGN_OR_RETURN(c.kda.gate_lower_bound, bound_keys.Float("gate_lower_bound"));
    if (!(c.kda.gate_lower_bound < 0)) {
      return bound_keys.Bad("gate_lower_bound", "must be negative (the log-decay is <= 0)");
    }
  }

  // MLA.
  DELTASERVE_ASSIGN_OR_RETURN(c.num_attention_heads, t.Int("num_attention_heads", 1));
  // Required, but null means a plain q_proj (Kimi Linear).
  if (!t.Contains("q_lora_rank")) return t.Missing("q_lora_rank");
  DELTASERVE_ASSIGN_OR_RETURN(c.q_lora_rank, t.IntOr("q_lora_rank", 1, 0));
  DELTASERVE_ASSIGN_OR_RETURN(c.kv_lora_rank, t.Int("kv_lora_rank", 1));
  DELTASERVE_ASSIGN_OR_RETURN(c.qk_nope_head_dim, t.Int("qk_nope_head_dim", 1));
  DELTASERVE_ASSIGN_OR_RETURN(c.qk_rope_head_dim, t.Int("qk_rope_head_dim", 0));
  DELTASERVE_ASSIGN_OR_RETURN(c.v_head_dim, t.Int("v_head_dim", 1));
  if (k3) {
    DELTASERVE_ASSIGN_OR_RETURN(c.mla_output_gate, t.Bool("mla_use_output_gate"));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(c.mla_output_gate, t.BoolOr("mla_use_output_gate", false));
  }

  // FFN.
  DELTASERVE_ASSIGN_OR_RETURN(c.hidden_act, t.String("hidden_act"));
  if (c.hidden_act != "silu" && c.hidden_act != "situ") {
    return t.Bad("hidden_act", "is '" + c.hidden_act + "'; expected 'silu' or 'situ'");
  }
  if (k3 || c.hidden_act == "situ") {
    DELTASERVE_ASSIGN_OR_RETURN(c.situ_beta, t.Float("activation_situ_beta"));
    if (!(c.situ_beta > 0)) return t.Bad("activation_situ_beta", "must be positive");
    DELTASERVE_ASSIGN_OR_RETURN(c.situ_linear_beta, t.Float("activation_situ_linear_beta"));
    if (!(c.situ_linear_beta > 0)) {
      return t.Bad("activation_situ_linear_beta", "must be positive");
    }
  }
  DELTASERVE_ASSIGN_OR_RETURN(c.intermediate_size, t.Int("intermediate_size", 1));
  DELTASERVE_RETURN_IF_ERROR(ParseMoe(t, &c));
  if (k3) {
    DELTASERVE_ASSIGN_OR_RETURN(c.routed_expert_hidden_size, t.Int("routed_expert_hidden_size", 1));
    DELTASERVE_ASSIGN_OR_RETURN(c.latent_moe_use_norm, t.Bool("latent_moe_use_norm"));
    DELTASERVE_ASSIGN_OR_RETURN(c.attn_res_block_size, t.Int("attn_res_block_size", 1));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(c.routed_expert_hidden_size,
                                t.IntOr("routed_expert_hidden_size", 1, 0));
    DELTASERVE_ASSIGN_OR_RETURN(c.latent_moe_use_norm, t.BoolOr("latent_moe_use_norm", false));
    if (t.Has("attn_res_block_size")) {
      return t.Bad("attn_res_block_size",
                   "is a K3 key; model_type kimi_linear has a plain residual stream");
    }
    c.attn_res_block_size = 0;
  }
  return c;
}

// Shortest decimal that reads back as the same float: 1e-5f is written as
// 1e-05, not 9.999999747378752e-06.
double ShortestDouble(float value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer) - 1, value);
  *result.ptr = '\0';
  return std::strtod(buffer, nullptr);
}

std::vector<int64_t> LayerList(const ModelConfig& config, LayerKind kind) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < config.layer_kinds.size(); ++i) {
    if (config.layer_kinds[i] == kind) out.push_back(static_cast<int64_t>(i) + 1);
  }
  return out;
}

}  // namespace

std::string ModelConfig::ModelPrefix() const { return ArchitectureOf(*this).ModelPrefix(); }

std::string ModelConfig::LmHeadName() const {
  // Tied embeddings have no lm_head tensor: the embedding is the head.
  if (tie_word_embeddings) return ModelPrefix() + "embed_tokens.weight";
  return ArchitectureOf(*this).LmHeadName();
}

// The products of config sizes that everything downstream multiplies out;
// ParseModelConfig's comment says why.
static absl::Status CheckSizeProducts(const ModelConfig& c, const std::string& source) {
  const std::string what = absl::StrCat(source, ": a product of sizes");
  const int64_t Z = c.routed_expert_hidden_size > 0 ? c.routed_expert_hidden_size : c.hidden_size;
  const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const int64_t widest_input =
      std::max({c.hidden_size, c.q_lora_rank, c.kv_lora_rank, c.kda.num_heads * c.kda.head_dim});
  // Every tensor dimension within kMaxSize: each tensor's elements then fit
  // in 2^48.
  for (const auto& factors : std::initializer_list<std::initializer_list<SizeFactor>>{
           {{"num_attention_heads", c.num_attention_heads},
            {"qk_nope_head_dim + qk_rope_head_dim", qk}},
           {{"num_attention_heads", c.num_attention_heads}, {"v_head_dim", c.v_head_dim}},
           {{"num_attention_heads", c.num_attention_heads},
            {"qk_nope_head_dim + v_head_dim", c.qk_nope_head_dim + c.v_head_dim}},
           {{"linear_attn_config.num_heads", c.kda.num_heads},
            {"linear_attn_config.head_dim", c.kda.head_dim}},
       }) {
    DELTASERVE_RETURN_IF_ERROR(CheckedProduct(factors, kMaxSize, what).status());
  }
  DELTASERVE_RETURN_IF_ERROR(CheckedProduct({{"num_hidden_layers", c.num_layers},
                                             {"num_experts + num_shared_experts + 1",
                                              c.num_experts + c.num_shared_experts + 1}},
                                            kMaxLayerExperts, what)
                                 .status());
  // The parameters of each part, so that their sum fits int64 with room.
  for (const auto& factors : std::initializer_list<std::initializer_list<SizeFactor>>{
           {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}},
           {{"num_hidden_layers", c.num_layers},
            {"num_experts + num_shared_experts", c.num_experts + c.num_shared_experts},
            {"3", 3},
            {"moe_intermediate_size", c.moe_intermediate_size},
            {"routed_expert_hidden_size (or hidden_size)", Z}},
           {{"num_hidden_layers", c.num_layers},
            {"3", 3},
            {"intermediate_size", c.intermediate_size},
            {"hidden_size", c.hidden_size}},
           {{"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"qk_nope_head_dim + qk_rope_head_dim + v_head_dim", qk + c.v_head_dim},
            {"the widest projection input", widest_input}},
           {{"num_hidden_layers", c.num_layers},
            {"8", 8},
            {"linear_attn_config.num_heads x head_dim", c.kda.num_heads * c.kda.head_dim},
            {"the widest projection input", widest_input}},
       }) {
    DELTASERVE_RETURN_IF_ERROR(CheckedProduct(factors, kMaxPartParameters, what).status());
  }
  // A sequence's recurrent state: one head_dim x head_dim matrix per head.
  DELTASERVE_RETURN_IF_ERROR(CheckedProduct({{"num_hidden_layers", c.num_layers},
                                             {"linear_attn_config.num_heads", c.kda.num_heads},
                                             {"head_dim", c.kda.head_dim},
                                             {"head_dim", c.kda.head_dim}},
                                            kMaxKdaStateFloats, what)
                                 .status());
  return absl::OkStatus();
}

// The parse, before CheckSizeProducts.
static absl::StatusOr<ModelConfig> ParseConfigText(const std::string& json_text,
                                                   const std::string& source) {
  DELTASERVE_RETURN_IF_ERROR(
      CheckJsonBounds(json_text, kMaxConfigJsonBytes, kMaxConfigJsonDepth, source));
  const json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": top level is not a JSON object"));
  }
  const ConfigObject top(&root, "", &source);
  DELTASERVE_ASSIGN_OR_RETURN(std::string model_type, top.String("model_type"));
  ModelConfig config;
  config.model_type = model_type;
  if (model_type == "kimi_k3") {
    // The nested text_config says kimi_linear in real K3 checkpoints: the
    // top-level model_type decides.
    config.arch = Architecture::kKimiK3;
    DELTASERVE_ASSIGN_OR_RETURN(ConfigObject text, top.Object("text_config"));
    DELTASERVE_ASSIGN_OR_RETURN(config, ParseFields(text, source, std::move(config)));
    DELTASERVE_RETURN_IF_ERROR(ParseQuantizationOf(top, &text, source, &config));
    return config;
  }
  if (model_type == "kimi_linear") {
    config.arch = Architecture::kKimiLinear;
    DELTASERVE_ASSIGN_OR_RETURN(config, ParseFields(top, source, std::move(config)));
    DELTASERVE_RETURN_IF_ERROR(ParseQuantizationOf(top, nullptr, source, &config));
    return config;
  }
  return absl::InvalidArgumentError(absl::StrCat(source, ": unsupported model_type '", model_type,
                                                 "' (expected 'kimi_k3' or 'kimi_linear')"));
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  absl::StatusOr<ModelConfig> config = ParseConfigText(json_text, source);
  if (config.ok()) DELTASERVE_RETURN_IF_ERROR(CheckSizeProducts(*config, source));
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  DELTASERVE_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, kMaxConfigJsonBytes));
  return ParseModelConfig(text, path);
}

std::string ModelConfigToJson(const ModelConfig& c) {
  using ojson = nlohmann::ordered_json;  // keeps the familiar key order
  const bool k3 = c.IsK3();
  ojson t = ojson::object();
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_layers;
  t["vocab_size"] = c.vocab_size;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_key_value_heads"] = c.num_attention_heads;
  t["q_lora_rank"] = c.q_lora_rank > 0 ? ojson(c.q_lora_rank) : ojson(nullptr);
  t["kv_lora_rank"] = c.kv_lora_rank;
  t["qk_nope_head_dim"] = c.qk_nope_head_dim;
  t["qk_rope_head_dim"] = c.qk_rope_head_dim;
  t["v_head_dim"] = c.v_head_dim;
  t["mla_use_nope"] = true;
  t["intermediate_size"] = c.intermediate_size;
  t["first_k_dense_replace"] = c.first_k_dense_replace;
  t["num_experts"] = c.num_experts;
  if (c.num_experts > 0) {
    t["moe_layer_freq"] = 1;
    t["num_experts_per_token"] = c.num_experts_per_token;
    t["num_shared_experts"] = c.num_shared_experts;
    t["moe_intermediate_size"] = c.moe_intermediate_size;
    t["moe_renormalize"] = c.moe_renormalize;
    t["moe_router_activation_func"] = "sigmoid";
    t["routed_scaling_factor"] = ShortestDouble(c.routed_scaling_factor);
    t["use_grouped_topk"] = true;
    t["num_expert_group"] = 1;
    t["topk_group"] = 1;
  }
  t["rms_norm_eps"] = ShortestDouble(c.rms_norm_eps);
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.max_position_embeddings > 0) {
    t["max_position_embeddings"] = c.max_position_embeddings;
  }
  ojson lin = ojson::object();
  lin["num_heads"] = c.kda.num_heads;
  lin["head_dim"] = c.kda.head_dim;
  lin["short_conv_kernel_size"] = c.kda.conv_kernel_size;
  lin["kda_layers"] = LayerList(c, LayerKind::kKda);
  lin["full_attn_layers"] = LayerList(c, LayerKind::kMla);
  if (k3 || c.kda.full_rank_gate) lin["use_full_rank_gate"] = c.kda.full_rank_gate;
  if (c.kda.has_lower_bound) {
    lin["gate_lower_bound"] = ShortestDouble(c.kda.gate_lower_bound);
  }
  t["linear_attn_config"] = std::move(lin);
  t["hidden_act"] = c.hidden_act;
  if (k3 || c.hidden_act == "situ") {
    t["activation_situ_beta"] = ShortestDouble(c.situ_beta);
    t["activation_situ_linear_beta"] = ShortestDouble(c.situ_linear_beta);
  }
  if (k3 || c.mla_output_gate) t["mla_use_output_gate"] = c.mla_output_gate;
  if (k3 || c.routed_expert_hidden_size > 0) {
    t["routed_expert_hidden_size"] = c.routed_expert_hidden_size;
    t["latent_moe_use_norm"] = c.latent_moe_use_norm;
  }
  if (k3) t["attn_res_block_size"] = c.attn_res_block_size;
  if (c.quantization.mxfp4) {
    // The block as real K3 checkpoints write it: one MXFP4 group.
    const QuantizationConfig& q = c.quantization;
    ojson weights = {{"num_bits", 4},
                     {"type", "float"},
                     {"group_size", 32},
                     {"strategy", "group"},
                     {"symmetric", true},
                     {"dynamic", false},
                     {"scale_dtype", "torch.uint8"}};
    ojson group = ojson::object();
    group["format"] = kMxfp4Format;
    group["targets"] = q.targets;
    group["weights"] = std::move(weights);
    group["input_activations"] = nullptr;
    group["output_activations"] = nullptr;
    ojson block = ojson::object();
    block["quant_method"] = "compressed-tensors";
    block["format"] = kMxfp4Format;
    block["quantization_status"] = "compressed";
    block["config_groups"] = {{"group_0", std::move(group)}};
    block["ignore"] = q.ignore;
    t["quantization_config"] = std::move(block);
  }

  ojson root = ojson::object();
  if (k3) {
    // The real K3 layout: a multimodal wrapper whose text_config carries a
    // Kimi Linear style decoder.
    t["model_type"] = "kimi_linear";
    t["architectures"] = ojson::array({"KimiLinearForCausalLM"});
    root["architectures"] = ojson::array({"KimiK3ForConditionalGeneration"});
    root["model_type"] = "kimi_k3";
    root["text_config"] = std::move(t);
  } else {
    root = std::move(t);
    root["model_type"] = "kimi_linear";
    root["architectures"] = ojson::array({"KimiLinearForCausalLM"});
  }
  root["torch_dtype"] = "bfloat16";
  return root.dump(2) + "\n";
}

}  // namespace deltaserve
