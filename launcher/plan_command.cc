// deltaserve plan: the pipeline stages of a deployment and what one rank of
// each stage holds, from the config alone (no weights are read); with
// --gpu-memory, the fewest GPUs (PP x TP) that hold the model and the largest
// context that fits on them.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "launcher/commands.h"
#include "launcher/flags.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/state_pool.h"
#include "runtime/model/weight_spec.h"
#include "runtime/scheduler/gpu_plan.h"
#include "runtime/scheduler/stage_plan.h"

namespace deltaserve {
namespace {

constexpr int64_t kDefaultContext = 4096;
// Far above any real pipeline; keeps the value inside an int.
constexpr int64_t kMaxParallelism = int64_t{1} << 20;

// printf into a string, for the few numbers with a chosen precision.
template <typename... T>
std::string Printf(const char* format, T... values) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, values...);
  return buffer;
}

absl::StatusOr<ModelConfig> ConfigFromFlags(const Flags& flags, std::string* source) {
  if (flags.Has("model") == flags.Has("config")) {
    return absl::InvalidArgumentError("give exactly one of --model DIR, --config FILE");
  }
  if (flags.Has("model")) {
    const std::string model = flags.GetString("model");
    // A preset name, unless a directory of that name is there.
    std::error_code error;
    if (!std::filesystem::is_directory(model, error) && model.find('/') == std::string::npos) {
      if (auto preset = PresetConfig(model); preset.ok()) {
        *source = absl::StrCat("preset ", model);
        return preset;
      }
    }
    *source = model + "/config.json";
    return LoadModelConfig(model);
  }
  *source = flags.GetString("config");
  std::ifstream in(*source, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(*source, ": cannot open (--config)"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseModelConfig(text.str(), *source);
}

absl::StatusOr<int64_t> IntInRange(const Flags& flags, const std::string& name, int64_t fallback,
                                   int64_t min, int64_t max) {
  DELTASERVE_ASSIGN_OR_RETURN(int64_t value, flags.GetInt(name, fallback));
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in ", min, "..", max, ", got ", value));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> ParseCounts(const std::string& text) {
  std::vector<int64_t> counts;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int64_t n = 0;
    if (!absl::SimpleAtoi(item, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage-layers: '", item, "' is not a layer count (expected e.g. 2,3,4)"));
    }
    counts.push_back(n);
  }
  return counts;
}

// "1.50 GiB (1610612736 B)": a readable size and the exact count; "512 B"
// below 1 KiB.
std::string Bytes(int64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrCat(Printf("%.2f %s", value, kUnits[unit]), " (", bytes, " B)");
}

std::string Count(int64_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e12) return Printf("%.2fT", v / 1e12);
  if (v >= 1e9) return Printf("%.2fB", v / 1e9);
  if (v >= 1e6) return Printf("%.2fM", v / 1e6);
  if (v >= 1e3) return Printf("%.2fK", v / 1e3);
  return absl::StrCat(n);
}

void PrintModel(const ModelConfig& c, const std::string& source) {
  std::vector<int64_t> mla;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.layer_kinds[static_cast<size_t>(i)] == LayerKind::kMla) mla.push_back(i);
  }
  const ParameterCount params = CountParameters(c);
  std::printf("model: %s (%s)\n", c.model_type.c_str(), source.c_str());
  std::printf("  %" PRId64 " layers: %" PRId64
              " KDA + %zu MLA (MLA at %s, 0-indexed), hidden %" PRId64 ", vocab %" PRId64 "\n",
              c.num_layers, c.num_layers - static_cast<int64_t>(mla.size()), mla.size(),
              absl::StrJoin(mla, ",").c_str(), c.hidden_size, c.vocab_size);
  std::printf("  KDA %" PRId64 " heads x %" PRId64 "; MLA %" PRId64 " heads, cache %" PRId64
              " + %" PRId64 " values per token and layer\n",
              c.kda.num_heads, c.kda.head_dim, c.num_attention_heads, c.kv_lora_rank,
              c.qk_rope_head_dim);
  if (c.num_experts > 0) {
    std::printf("  FFN: %" PRId64 " dense (width %" PRId64 "), then %" PRId64 " experts, %" PRId64
                " active + %" PRId64 " shared, width %" PRId64 "%s\n",
                std::min(c.first_k_dense_replace, c.num_layers), c.intermediate_size, c.num_experts,
                c.num_experts_per_token, c.num_shared_experts, c.moe_intermediate_size,
                c.routed_expert_hidden_size > 0
                    ? absl::StrCat(", latent ", c.routed_expert_hidden_size).c_str()
                    : "");
  } else {
    std::printf("  FFN: dense, width %" PRId64 "\n", c.intermediate_size);
  }
  if (c.attn_res_block_size > 0) {
    std::printf("  attention residuals in blocks of %" PRId64 " layers\n", c.attn_res_block_size);
  }
  std::printf("  parameters: %s total, %s active per token\n", Count(params.total).c_str(),
              Count(params.active_per_token).c_str());
}

// Left-aligned text columns, numbers right-aligned, widths from the cells.
void PrintTable(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(width[i] - row[i].size(), ' ');
      line += right[i] ? pad + row[i] : row[i] + (i + 1 < row.size() ? pad : "");
      if (i + 1 < row.size()) line += "  ";
    }
    std::printf("%s\n", line.c_str());
  }
}

std::string Layers(const StageRange& range) {
  if (range.size() == 1) return absl::StrCat(range.begin);
  return absl::StrCat(range.begin, "-", range.end - 1);
}

void PrintPlan(const ModelConfig& c, const std::vector<StageReport>& reports, int64_t context) {
  double total_cost = 0, max_cost = 0;
  for (const StageReport& r : reports) {
    total_cost += r.cost;
    max_cost = std::max(max_cost, r.cost);
  }
  auto share = [&](double cost) {
    return Printf("%.1f%%", total_cost > 0 ? 100 * cost / total_cost : 0.0);
  };
  std::vector<std::vector<std::string>> rows = {
      {"stage", "layers", "KDA", "MLA", "weights per rank", "KDA state per sequence",
       absl::StrCat("MLA cache at ", context, " tokens (", CachePagesFor(context), " pages of ",
                    kCachePageTokens, ")"),
       // Attention residuals send the bank along with the running prefix.
       c.attn_res_block_size > 0 ? "to next stage per token (prefix + bank)"
                                 : "to next stage per token",
       "cost"}};
  StageReport total;
  for (size_t s = 0; s < reports.size(); ++s) {
    const StageReport& r = reports[s];
    const bool last = s + 1 == reports.size();
    rows.push_back({absl::StrCat(s), Layers(r.layers), absl::StrCat(r.kda_layers),
                    absl::StrCat(r.mla_layers), Bytes(r.weight_bytes_per_rank),
                    Bytes(r.kda_state_bytes_per_sequence), Bytes(r.mla_cache_bytes),
                    last ? "-" : Bytes(r.boundary_bytes_per_token), share(r.cost)});
    total.kda_layers += r.kda_layers;
    total.mla_layers += r.mla_layers;
    total.weight_bytes_per_rank += r.weight_bytes_per_rank;
    total.kda_state_bytes_per_sequence += r.kda_state_bytes_per_sequence;
    total.mla_cache_bytes += r.mla_cache_bytes;
    total.boundary_bytes_per_token += r.boundary_bytes_per_token;
  }
  rows.push_back({"total", "", absl::StrCat(total.kda_layers), absl::StrCat(total.mla_layers),
                  Bytes(total.weight_bytes_per_rank), Bytes(total.kda_state_bytes_per_sequence),
                  Bytes(total.mla_cache_bytes), Bytes(total.boundary_bytes_per_token),
                  share(total_cost)});
  PrintTable(rows, {false, false, true, true, false, false, false, false, true});
  std::printf(
      "(totals add one TP rank of every stage; the boundary total is what one token "
      "sends through the whole pipeline)\n");

  size_t largest = 0;
  int64_t largest_bytes = -1;
  for (size_t s = 0; s < reports.size(); ++s) {
    const StageReport& r = reports[s];
    const int64_t bytes =
        r.weight_bytes_per_rank + r.kda_state_bytes_per_sequence + r.mla_cache_bytes;
    if (bytes > largest_bytes) {
      largest = s;
      largest_bytes = bytes;
    }
  }
  std::printf("largest rank, one sequence of %" PRId64
              " tokens: stage %zu, %s (weights + KDA state + MLA cache)\n",
              context, largest, Bytes(largest_bytes).c_str());
  const double ideal = total_cost / static_cast<double>(reports.size());
  std::printf("prefill cost model at %" PRId64
              " tokens: %.3g FLOP in all, slowest stage %.3f x the ideal (total / pp)\n",
              context, total_cost, ideal > 0 ? max_cost / ideal : 1.0);
}

absl::StatusOr<int64_t> CacheBytesOf(const Flags& flags) {
  const int given = flags.Has("cache-bytes") + flags.Has("kv-dtype") + flags.Has("kv-cache-dtype");
  if (given > 1) {
    return absl::InvalidArgumentError("give one of --kv-dtype, --kv-cache-dtype, --cache-bytes");
  }
  if (flags.Has("cache-bytes")) return IntInRange(flags, "cache-bytes", 2, 1, 8);
  const char* name = flags.Has("kv-cache-dtype") ? "kv-cache-dtype" : "kv-dtype";
  const std::string dtype = flags.GetString(name, "bf16");
  if (dtype == "bf16") return 2;
  if (dtype == "f32") return 4;
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, " must be bf16 or f32, got '", dtype, "'"));
}

void PrintGpuLayout(const ModelConfig& c, const GpuLayout& layout, const GpuBudget& budget,
                    int64_t context) {
  const int64_t shown = layout.max_context_tokens;
  std::vector<std::vector<std::string>> rows = {
      {"stage", "layers", "MLA", "GPUs", "weights", "KDA state",
       absl::StrCat("MLA cache at ", shown, " tokens"), "workspace", "total per GPU", "free"}};
  for (size_t s = 0; s < layout.stages.size(); ++s) {
    const GpuStageMemory& m = layout.stages[s];
    rows.push_back({absl::StrCat(s), Layers(m.layers), absl::StrCat(m.mla_layers),
                    absl::StrCat(layout.tp), Bytes(m.weight_bytes), Bytes(m.kda_state_bytes),
                    Bytes(m.CacheBytes(shown)), Bytes(m.workspace_bytes),
                    Bytes(m.TotalBytes(shown)),
                    ByteSizeText(budget.gpu_memory_bytes - m.TotalBytes(shown))});
  }
  PrintTable(rows, {false, false, true, true, false, false, false, false, false, true});
  std::printf("largest context per replica: %" PRId64
              " tokens of MLA cache (stage %zu is the "
              "tightest)\n",
              shown, layout.tightest_stage);
  if (shown > c.max_position_embeddings && c.max_position_embeddings > 0) {
    std::printf("  one sequence is capped at the model's %" PRId64
                " tokens (max_position_embeddings); the cache holds %.2f such sequences, each "
                "needing a KDA state slot (--sequences)\n",
                c.max_position_embeddings,
                static_cast<double>(shown) / static_cast<double>(c.max_position_embeddings));
  }
  size_t fullest = 0;
  for (size_t s = 0; s < layout.stages.size(); ++s) {
    if (layout.stages[s].TotalBytes(context) > layout.stages[fullest].TotalBytes(context)) {
      fullest = s;
    }
  }
  std::printf("at --context %" PRId64 ": stage %zu is the fullest, %s per GPU of %s\n", context,
              fullest, Bytes(layout.stages[fullest].TotalBytes(context)).c_str(),
              ByteSizeText(budget.gpu_memory_bytes).c_str());
}

absl::Status RunGpuPlan(const Flags& flags, const ModelConfig& config, const std::string& source) {
  if (flags.Has("stage-layers")) {
    return absl::InvalidArgumentError(
        "--stage-layers is not used with --gpu-memory (the stage planner splits the layers)");
  }
  GpuBudget budget;
  DELTASERVE_ASSIGN_OR_RETURN(budget.gpu_memory_bytes, flags.GetByteSize("gpu-memory", 0));
  if (budget.gpu_memory_bytes <= 0)
    return absl::InvalidArgumentError("--gpu-memory must be positive");
  DELTASERVE_ASSIGN_OR_RETURN(budget.gpus_per_node, IntInRange(flags, "gpus-per-node", 8, 1, 1024));
  DELTASERVE_ASSIGN_OR_RETURN(budget.workspace_bytes,
                              flags.GetByteSize("workspace", kDefaultGpuWorkspaceBytes));
  DELTASERVE_ASSIGN_OR_RETURN(budget.sequences, IntInRange(flags, "sequences", 1, 1, 1 << 20));
  DELTASERVE_ASSIGN_OR_RETURN(budget.bytes.cache, CacheBytesOf(flags));
  if (flags.Has("weight-bytes")) {
    DELTASERVE_ASSIGN_OR_RETURN(budget.bytes.weight, IntInRange(flags, "weight-bytes", 4, 1, 8));
  }
  DELTASERVE_ASSIGN_OR_RETURN(budget.bytes.state, IntInRange(flags, "state-bytes", 4, 1, 8));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t context,
                              IntInRange(flags, "context", kDefaultContext, 1, int64_t{1} << 34));
  int64_t pp = 0, tp = 0;
  if (flags.Has("pp")) {
    DELTASERVE_ASSIGN_OR_RETURN(pp, IntInRange(flags, "pp", 1, 1, config.num_layers));
  }
  if (flags.Has("tp")) {
    DELTASERVE_ASSIGN_OR_RETURN(tp, IntInRange(flags, "tp", 1, 1, budget.gpus_per_node));
    if (budget.gpus_per_node % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tp ", tp, " does not divide --gpus-per-node ", budget.gpus_per_node,
                       " (a TP group stays inside one node)"));
    }
    if (absl::Status s = CheckTensorParallel(config, static_cast<int>(tp)); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, ": ", s.message()));
    }
  }
  const std::string memory = flags.GetString("gpu-memory");
  absl::StatusOr<GpuLayout> found =
      pp > 0 && tp > 0
          ? EvaluateLayout(config, static_cast<int>(pp), static_cast<int>(tp), context, budget)
          : SmallestLayout(config, context, budget, static_cast<int>(pp), static_cast<int>(tp));
  if (!found.ok()) {
    return absl::Status(found.status().code(),
                        absl::StrCat("--gpu-memory ", memory, ": ", found.status().message()));
  }
  const GpuLayout& layout = *found;

  PrintModel(config, source);
  const std::string weights =
      budget.bytes.weight == PlanBytes::kAsStored
          ? std::string(config.quantization.mxfp4
                            ? "as stored (bf16, MXFP4 routed experts 0.5 B + 1 scale per 32)"
                            : "as stored")
          : absl::StrCat(budget.bytes.weight, " B each");
  std::printf(
      "GPUs: %s each, %" PRId64 " per node; per GPU: weights %s, KDA state %" PRId64
      " B a value for %" PRId64 " %s, MLA cache %s in pages of %" PRId64 " tokens, workspace %s\n",
      ByteSizeText(budget.gpu_memory_bytes).c_str(), budget.gpus_per_node, weights.c_str(),
      budget.bytes.state, budget.sequences, budget.sequences == 1 ? "sequence" : "sequences",
      budget.bytes.cache == 2   ? "bf16"
      : budget.bytes.cache == 4 ? "f32"
                                : absl::StrCat(budget.bytes.cache, " B").c_str(),
      kCachePageTokens, ByteSizeText(budget.workspace_bytes).c_str());
  std::printf(
      "layout: %" PRId64 " %s on %" PRId64
      " %s: PP %d x TP %d (%s); stages balanced by "
      "the prefill cost model at %" PRId64 " tokens\n\n",
      layout.gpus(), layout.gpus() == 1 ? "GPU" : "GPUs", layout.Nodes(budget.gpus_per_node),
      layout.Nodes(budget.gpus_per_node) == 1 ? "node" : "nodes", layout.pp, layout.tp,
      pp > 0 && tp > 0
          ? "as given"
          : absl::StrCat("the fewest GPUs that hold ", context, " tokens of context").c_str(),
      context);
  PrintGpuLayout(config, layout, budget, context);
  return absl::OkStatus();
}
}  // namespace

const CommandSpec& PlanSpec() {
  static const auto* spec = new CommandSpec{
      .name = "plan",
      .summary = "the stages of a deployment and the memory and traffic of each rank",
      .usage = "(--model DIR | --config FILE) (--pp N --tp M | --gpu-memory SIZE) [flags]",
      .flags =
          {
              {"model", "DIR",
               "a model directory (only its config.json is read), or a preset: "
               "k3 (the real Kimi K3), k3-small, k3-tiny, kimi-linear-tiny"},
              {"config", "FILE", "a config.json"},
              {"pp", "N", "pipeline stages"},
              {"tp", "M", "tensor-parallel ranks per stage"},
              {"context", "T", "tokens of context to plan for", absl::StrCat(kDefaultContext)},
              {"stage-layers", "2,3,4", "layers per stage instead of the planner's split"},
              {"weight-bytes", "B",
               "bytes per weight element for every weight, 1..8 (4: all in float32)",
               "as stored: bf16 2, f32 4, MXFP4 experts 0.5 + 1 per 32"},
              {"cache-bytes", "B", "bytes per MLA cache element", "4"},
              {"state-bytes", "B", "bytes per KDA state element", "4"},
              {"activation-bytes", "B", "bytes per activation element sent between stages", "4"},
              {"gpu-memory", "SIZE",
               "plan for GPUs of this much memory (bytes, or KiB/MiB/GiB/TiB: 141GiB): the fewest "
               "GPUs that hold --context tokens, and the largest context that fits them; "
               "--pp/--tp then fix a layout instead of searching"},
              {"gpus-per-node", "N", "GPUs per node (a TP group stays inside a node)", "8"},
              {"kv-dtype", "bf16|f32", "MLA latent cache dtype, with --gpu-memory", "bf16"},
              {"kv-cache-dtype", "bf16|f32", "the same as --kv-dtype (serve's name for it)"},
              {"workspace", "SIZE",
               "reserve per GPU for the CUDA context, library workspaces, communication buffers "
               "and prefill activations, with --gpu-memory",
               "4GiB"},
              {"sequences", "N",
               "sequences holding KDA state at once (one slot each), with --gpu-memory", "1"},
          },
      .examples = {"deltaserve plan --model DIR --pp 4 --tp 8 --context 1048576",
                   "deltaserve plan --model k3 --gpu-memory 141GiB --gpus-per-node 8 "
                   "--context 1048576"},
  };
  return *spec;
}

absl::Status RunPlan(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(PlanSpec(), args));
  std::string source;
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, ConfigFromFlags(flags, &source));
  if (flags.Has("gpu-memory")) return RunGpuPlan(flags, config, source);
  for (const char* name :
       {"gpus-per-node", "kv-dtype", "kv-cache-dtype", "workspace", "sequences"}) {
    if (flags.Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs --gpu-memory"));
    }
  }
  DELTASERVE_RETURN_IF_ERROR(flags.Required("pp").status());
  DELTASERVE_RETURN_IF_ERROR(flags.Required("tp").status());
  DELTASERVE_ASSIGN_OR_RETURN(int64_t pp, IntInRange(flags, "pp", 1, 1, kMaxParallelism));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t tp, IntInRange(flags, "tp", 1, 1, kMaxParallelism));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t context,
                              IntInRange(flags, "context", kDefaultContext, 1, int64_t{1} << 34));
  PlanBytes bytes;
  if (flags.Has("weight-bytes")) {
    DELTASERVE_ASSIGN_OR_RETURN(bytes.weight, IntInRange(flags, "weight-bytes", 4, 1, 8));
  }
  DELTASERVE_ASSIGN_OR_RETURN(bytes.cache, IntInRange(flags, "cache-bytes", 4, 1, 8));
  DELTASERVE_ASSIGN_OR_RETURN(bytes.state, IntInRange(flags, "state-bytes", 4, 1, 8));
  DELTASERVE_ASSIGN_OR_RETURN(bytes.activation, IntInRange(flags, "activation-bytes", 4, 1, 8));

  if (absl::Status s = CheckTensorParallel(config, static_cast<int>(tp)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, ": ", s.message()));
  }
  StagePlan plan;
  std::string how;
  if (flags.Has("stage-layers")) {
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<int64_t> counts,
                                ParseCounts(flags.GetString("stage-layers")));
    if (static_cast<int64_t>(counts.size()) != pp) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage-layers gives ", counts.size(), " stages but --pp is ", pp));
    }
    auto from_counts = StagesFromCounts(config, counts);
    if (!from_counts.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage-layers: ", from_counts.status().message()));
    }
    plan = *std::move(from_counts);
    how = "as given by --stage-layers";
  } else {
    auto planned = PlanStages(config, static_cast<int>(pp), context);
    if (!planned.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pp ", pp, ": ", planned.status().message()));
    }
    plan = *std::move(planned);
    how = absl::StrCat("balanced by the prefill cost model at ", context, " tokens");
  }
  DELTASERVE_ASSIGN_OR_RETURN(std::vector<StageReport> reports,
                              ReportPlan(config, plan, static_cast<int>(tp), context, bytes));

  PrintModel(config, source);
  std::printf("plan: %" PRId64 " pipeline stages x tensor parallelism %" PRId64 ", context %" PRId64
              " tokens\n",
              pp, tp, context);
  const std::string weights =
      bytes.weight == PlanBytes::kAsStored
          ? std::string(config.quantization.mxfp4
                            ? "as held (matrices as stored: bf16 2, f32 4, MXFP4 routed experts "
                              "0.5 + 1 per 32; vectors f32 4)"
                            : "as held (matrices as stored: bf16 2, f32 4; vectors f32 4)")
          : absl::StrCat(bytes.weight);
  std::printf("  bytes per element: weights %s, MLA cache %" PRId64 ", KDA state %" PRId64
              ", activations %" PRId64 "\n",
              weights.c_str(), bytes.cache, bytes.state, bytes.activation);
  std::printf("  stages %s", how.c_str());
  if (config.attn_res_block_size > 0 && plan.stages.size() > 1) {
    int64_t aligned = 0;
    for (size_t s = 1; s < plan.stages.size(); ++s) {
      aligned += plan.stages[s].begin % config.attn_res_block_size == 0;
    }
    std::printf("; %" PRId64 " of %zu boundaries on attention-residual block starts", aligned,
                plan.stages.size() - 1);
  }
  std::printf("\n\n");
  PrintPlan(config, reports, context);
  return absl::OkStatus();
}

}  // namespace deltaserve
