#include "launcher/deployment.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/threads.h"
#include "kernels/workspace.h"
#include "runtime/comm/launch_env.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/common/status_macros.h"
#include "runtime/scheduler/stage_plan.h"

namespace deltaserve {
namespace {

bool mpi_started = false;

}  // namespace

const std::vector<FlagSpec>& DeploymentFlags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"model", "DIR", "the model: config.json, model.safetensors (or shards), tokenizer files"},
      {"threads", "N", "compute threads of this process (0: OpenMP's default)", "0"},
      {"kv-cache-dtype", "f32|bf16",
       "dtype of the MLA latent cache (bf16: half the bytes; docs/numerics.md)", "f32"},
      {"kv-cache-tokens", "N",
       "tokens of MLA cache per rank over all sequences, in pages of 64 (0: 64 sequences of the "
       "model's context); a batch that does not fit is refused before it runs",
       "0"},
      {"kv-state-slots", "N",
       "sequences whose state a rank holds at once, running ones and prefixes kept for their "
       "forks, one fixed slot of KDA state each (0: 256, or twice --max-running when more)",
       "0"},
      {"compute-dtype", "f32|bf16",
       "GEMM precision on bf16 weights (bf16: activations rounded for bf16 units; "
       "docs/numerics.md)",
       "f32"},
      {"pp", "N", "pipeline stages; with --tp, runs as an MPI job of pp x tp ranks (mpirun/srun)",
       "1"},
      {"boundary-dtype", "f32|bf16",
       "dtype of what a pipeline stage sends the next, the running prefix and K3's block "
       "summaries (bf16: half the bytes; docs/numerics.md)",
       "f32"},
      {"tp", "M", "tensor-parallel ranks per stage", "1"},
      {"stage-layers", "2,3,4",
       "layers per pipeline stage, one count per stage (default: balanced by the cost model)"},
      {"device", "cpu|cuda|cuda:N",
       "where the model runs: the CPU, or a CUDA GPU (cuda: under mpirun or srun, the GPU of "
       "the process's rank on its node; else cuda:0)",
       "cpu"},
  };
  return *flags;
}

namespace {

// --device: the CPU, or the CUDA device it names, selected for this process.
absl::StatusOr<kernels::Device> SelectDevice(const Flags& flags) {
  const std::string value = flags.GetString("device", "cpu");
  if (value == "cpu") return kernels::Device::kCpu;
  if (value != "cuda" && !value.starts_with("cuda:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device is '", value, "'; it must be cpu, cuda or cuda:N"));
  }
  std::string error;
  const int count = kernels::CudaDeviceCount(&error);
  if (count <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("--device ", value, ": ", error));
  }
  int ordinal = 0;
  if (value == "cuda") {
    // One GPU per rank of a node, in local-rank order.
    const int local = LauncherLocalRank();
    ordinal = local >= 0 ? local % count : 0;
  } else if (!absl::SimpleAtoi(value.substr(5), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device is '", value, "'; N in cuda:N must be a number >= 0"));
  }
  if (ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", value, ": this machine has ", count,
                                                   " CUDA device", count == 1 ? "" : "s",
                                                   " (cuda:0 to cuda:", count - 1, ")"));
  }
  if (error = kernels::SelectCudaDevice(ordinal); !error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", value, ": cannot select cuda:", ordinal, ": ", error));
  }
  return kernels::Device::kCuda;
}

}  // namespace

absl::StatusOr<ModelConfig> DeploymentConfig(const Flags& flags) {
  DELTASERVE_ASSIGN_OR_RETURN(std::string dir, flags.Required("model"));
  return LoadModelConfig(dir);
}

absl::StatusOr<Deployment> Deploy(const Flags& flags, const ModelConfig& config,
                                  int64_t context_tokens) {
  Deployment d;
  d.config = config;
  DELTASERVE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 0));
  kernels::SetNumThreads(static_cast<int>(threads));
  DELTASERVE_ASSIGN_OR_RETURN(std::string dir, flags.Required("model"));
  ModelOptions options;
  for (const auto& [flag, dtype] : {std::pair{"kv-cache-dtype", &options.kv_cache_dtype},
                                    std::pair{"compute-dtype", &options.compute_dtype},
                                    std::pair{"boundary-dtype", &options.boundary_dtype}}) {
    const std::string value = flags.GetString(flag, "f32");
    if (value == "bf16") {
      *dtype = kernels::DType::kBF16;
    } else if (value != "f32") {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " is '", value, "'; it must be f32 or bf16"));
    }
  }
  DELTASERVE_ASSIGN_OR_RETURN(options.cache_tokens, flags.GetInt("kv-cache-tokens", 0));
  if (options.cache_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-tokens is ", options.cache_tokens, "; it must be >= 0"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(options.state_slots, flags.GetInt("kv-state-slots", 0));
  if (options.state_slots == 0) {
    // Room for as many running sequences as the command allows and a held
    // prefix for each (a batch job's documents).
    DELTASERVE_ASSIGN_OR_RETURN(int64_t max_running, flags.GetInt("max-running", 0));
    options.state_slots = std::max<int64_t>(kDefaultStateSlots, 2 * max_running);
  } else if (options.state_slots < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-state-slots is ", options.state_slots,
                     "; it must be >= 2 (a prefix and a sequence that forks from it)"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(options.device, SelectDevice(flags));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t pp, flags.GetInt("pp", 1));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t tp, flags.GetInt("tp", 1));
  DELTASERVE_ASSIGN_OR_RETURN(d.layout,
                              WorldLayout::Make(1, static_cast<int>(pp), static_cast<int>(tp)));
  d.distributed = LaunchedUnderMpi() || d.layout.WorldSize() > 1 || flags.Has("stage-layers");
  if (!d.distributed) {
    DELTASERVE_ASSIGN_OR_RETURN(
        d.comms,
        MakeRankCommunicators(d.layout, std::make_unique<SingleCommunicator>(), options.device));
    DELTASERVE_ASSIGN_OR_RETURN(d.model, Model::Load(dir, {}, d.comms.tp.get(), options));
    d.executor =
        std::make_unique<StepExecutor>(*d.model, d.layout, *d.comms.control, *d.comms.stage);
    d.replica = std::make_unique<Replica>(*d.executor);
    d.description = "single process";
    return d;
  }

  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, InitMpiWorld(nullptr, nullptr));
  mpi_started = true;
  // Refuses a layout that does not match the world before any work, then
  // builds the stage and TP data communicators (collective over the world).
  DELTASERVE_ASSIGN_OR_RETURN(d.comms,
                              MakeRankCommunicators(d.layout, std::move(world), options.device));
  const RankCoord coord = d.layout.CoordOf(d.comms.control->rank());

  StagePlan plan;
  if (flags.Has("stage-layers")) {
    std::vector<int64_t> counts;
    DELTASERVE_ASSIGN_OR_RETURN(std::vector<int32_t> parsed,
                                ParseTokenList(flags.GetString("stage-layers"), "--stage-layers"));
    counts.assign(parsed.begin(), parsed.end());
    if (static_cast<int64_t>(counts.size()) != pp) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage-layers gives ", counts.size(), " stages but --pp is ", pp));
    }
    DELTASERVE_ASSIGN_OR_RETURN(plan, StagesFromCounts(config, counts));
  } else {
    DELTASERVE_ASSIGN_OR_RETURN(plan, PlanStages(config, static_cast<int>(pp), context_tokens));
  }
  const StageRange range = plan.stages[coord.stage];
  ModelShard shard;
  shard.layer_begin = range.begin;
  shard.layer_end = range.end;
  shard.tp_rank = coord.tp_rank;
  shard.tp_size = d.layout.tp;
  DELTASERVE_ASSIGN_OR_RETURN(d.model, Model::Load(dir, shard, d.comms.tp.get(), options));
  d.executor = std::make_unique<StepExecutor>(*d.model, d.layout, *d.comms.control, *d.comms.stage);
  d.replica = std::make_unique<Replica>(*d.executor);
  d.description =
      absl::StrCat("rank ", d.comms.control->rank(), ": stage ", coord.stage, " (layers ",
                   range.begin, "-", range.end - 1, "), tp ", coord.tp_rank, " of ", d.layout.tp);
  return d;
}

void EndDeployment(bool ok) {
  if (!mpi_started) return;
  if (ok) {
    FinalizeMpi();
  } else {
    AbortMpi(1);
  }
}

void PrintPipelineStats(const Deployment& d) {
  const WeightBytes w = d.model->weight_bytes();
  std::string held;
  for (const auto& [dtype, bytes] : w.by_dtype) {
    absl::StrAppend(&held, held.empty() ? "" : ", ", dtype, " ",
                    absl::StrFormat("%.1f MB", bytes / 1e6));
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB on Linux
  std::fprintf(stderr,
               "%s: weights %s; matrices mapped from the checkpoint %.1f MB, copied at load "
               "%.1f MB; peak resident memory %.1f MB\n",
               d.description.c_str(), held.c_str(), w.mapped / 1e6, w.copied / 1e6,
               static_cast<double>(usage.ru_maxrss) * 1024 / 1e6);
  if (!d.distributed) return;
  const PipelineStats& s = d.executor->stage().stats();
  std::fprintf(stderr,
               "%s: read %lld checkpoint bytes; sent %lld bytes for %lld tokens to the next "
               "stage (%lld bytes/token); compute %.3f s of %.3f s\n",
               d.description.c_str(), static_cast<long long>(d.model->bytes_read()),
               static_cast<long long>(s.bytes_sent), static_cast<long long>(s.tokens_sent),
               static_cast<long long>(s.tokens_sent > 0 ? s.bytes_sent / s.tokens_sent : 0),
               s.compute_s, s.busy_wall_s);
}

}  // namespace deltaserve
