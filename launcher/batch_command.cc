// batch: a JSONL file of requests (generate, score, and long documents with
// several questions) to a JSONL file of records, resumable after any crash.
// Embedded (the model in this process), as an MPI job (--pp/--tp under
// mpirun or srun; rank 0 reads and writes), or as a client of a running
// server (--server). docs/batch.md is the user's guide.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "launcher/batch_output.h"
#include "launcher/batch_progress.h"
#include "launcher/batch_runners.h"
#include "launcher/batch_source.h"
#include "launcher/channel_flags.h"
#include "launcher/commands.h"
#include "launcher/deployment.h"
#include "runtime/comm/mpi_runtime.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/chat_format.h"

namespace deltaserve {
namespace {

constexpr int64_t kDefaultMaxRunning = 16;
constexpr int64_t kDefaultStepTokens = 2048;
constexpr int64_t kDefaultPlanContext = 32768;
constexpr int64_t kDefaultConcurrency = 8;
// The bound on one input line, which is read whole into memory (and its
// JSON tree, some times larger). A token as text is a few bytes of UTF-8,
// up to 6 per byte as a JSON escape; as an id at most 8 ("1048575, "): 32
// bytes per token of the context holds any prompt the model can take with
// room to spare.
constexpr int64_t kLineBytesPerToken = 32;
constexpr int64_t kMinDefaultLineBytes = int64_t{1} << 20;
constexpr int64_t kDefaultMaxLineBytes = int64_t{16} << 20;  // no model to size it by
constexpr int64_t kMaxLineBytesFlag = int64_t{1} << 32;

constexpr char kDetails[] =
    "Input: one JSON request per line, each with a unique \"id\" (string or integer):\n"
    "  {\"id\": \"a\", \"text\": \"hello\", \"max_tokens\": 32, \"temperature\": 0.7, \"seed\": "
    "1}\n"
    "  {\"id\": \"b\", \"task\": \"score\", \"tokens\": [1, 2, 3, 4]}\n"
    "  {\"id\": \"c\", \"document\": \"...\", \"questions\": [\"Q1?\", \"Q2?\"], \"max_tokens\": "
    "64}\n"
    "  {\"id\": \"d\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi!\"}]}\n"
    "Fields as in the gRPC API: text | tokens | messages (with tools, chat_template_kwargs),\n"
    "max_tokens (0: 16), temperature, top_k, top_p, seed, stop, stop_token_ids, ignore_eos,\n"
    "logprobs, top_logprobs, checked as the servers check them. The long-document form\n"
    "answers each question after the document (document tokens, then the question's).\n"
    "Output: one record per request (per question), in the order they finish: id, [question],\n"
    "text, token_ids, finish_reason, [reply], usage, timings; score: token_ids, logprobs,\n"
    "total_logprob; a bad line or a failed request: id, line, error. The job goes on.\n"
    "A line longer than --max-line-bytes is an error record, not read into memory.\n"
    "Rerunning with the same --output (or --resume) skips the records already there; with\n"
    "--retry-errors the error records there are dropped and their requests run again. A record\n"
    "is written whole and synced, so kill -9 at any moment loses at most the requests in\n"
    "flight. Only records of the shape batch writes count as done; --output must be a new\n"
    "name or a regular file (no link, FIFO or device), and not the input. See docs/batch.md.";

// What the requests are checked against: the model's config, tokenizer and
// chat format, loaded as `serve` loads them (a model directory without a
// tokenizer takes token ids; without a chat format, no conversations).
struct LoadedModel {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatFormat> chat;
  std::unique_ptr<BatchModel> model;
};

absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const ModelConfig& config) {
  LoadedModel loaded;
  if (auto tokenizer = LoadTokenizer(dir, config.vocab_size); tokenizer.ok()) {
    loaded.tokenizer = std::move(*tokenizer);
  } else if (!absl::IsNotFound(tokenizer.status())) {
    return tokenizer.status();
  }
  if (auto chat = LoadChatFormat(dir); chat.ok()) {
    loaded.chat = std::move(*chat);
  } else if (!absl::IsNotFound(chat.status())) {
    return chat.status();
  }
  loaded.model = std::make_unique<BatchModel>(config, loaded.tokenizer.get(), loaded.chat.get());
  return loaded;
}

}  // namespace

const CommandSpec& BatchSpec() {
  static const auto* spec = new CommandSpec{
      .name = "batch",
      .summary = "run a JSONL file of requests to a JSONL file of records; resumable",
      .usage = "--input IN.jsonl --output OUT.jsonl (--model DIR | --server HOST:PORT) [flags]",
      .flags = Concat(
          DeploymentFlags(),
          Concat(
              {
                  {"input", "IN.jsonl", "the requests, one JSON object per line"},
                  {"output", "OUT.jsonl",
                   "the records; appended to, and resumed from, when it exists"},
                  {"resume", "",
                   "continue OUT.jsonl (what a rerun does anyway; says so explicitly)"},
                  {"overwrite", "", "empty OUT.jsonl first instead of resuming it"},
                  {"retry-errors", "",
                   "resume, and run again the requests whose records in OUT.jsonl are errors "
                   "(those records are dropped)"},
                  {"max-line-bytes", "N",
                   "the longest input line read; a longer one is an error record (default: 32 "
                   "bytes per token of the model's context, at least 1 MiB; 16 MiB with --server "
                   "and no --model)"},
                  {"max-running", "N", "requests in the engine at once, sharing its steps",
                   absl::StrCat(kDefaultMaxRunning)},
                  {"step-tokens", "N", "token budget of one engine step",
                   absl::StrCat(kDefaultStepTokens)},
                  {"plan-context", "T", "MPI jobs: the context the stage split is balanced for",
                   absl::StrCat(kDefaultPlanContext)},
                  {"server", "HOST:PORT",
                   "send the requests to a running server instead of loading the model here; "
                   "--model then only lends its tokenizer (for text in long documents) and checks"},
                  {"concurrency", "N", "--server: requests in flight",
                   absl::StrCat(kDefaultConcurrency)},
                  {"retry-s", "S",
                   "--server: how long a request is retried while the server is unavailable", "60"},
                  {"quiet", "", "no progress lines; only the summary"},
                  {"progress-interval", "S",
                   "seconds between progress lines (default: 1 on a terminal, 30 into a log)"},
              },
              ChannelSecurityFlags("token-file"))),
      .examples =
          {
              "deltaserve batch --model /tmp/k3-tiny --input in.jsonl --output out.jsonl",
              "mpirun -np 2 deltaserve batch --pp 2 --model DIR --input in.jsonl --output "
              "out.jsonl",
              "deltaserve batch --server 127.0.0.1:50051 --concurrency 16 --input in.jsonl "
              "--output out.jsonl",
          },
      .details = kDetails,
  };
  return *spec;
}

absl::Status RunBatch(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(BatchSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(std::string input, flags.Required("input"));
  DELTASERVE_ASSIGN_OR_RETURN(std::string output_path, flags.Required("output"));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t max_running, flags.GetInt("max-running", kDefaultMaxRunning));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t step_tokens, flags.GetInt("step-tokens", kDefaultStepTokens));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t plan_context,
                              flags.GetInt("plan-context", kDefaultPlanContext));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t concurrency,
                              flags.GetInt("concurrency", kDefaultConcurrency));
  DELTASERVE_ASSIGN_OR_RETURN(double retry_s, flags.GetDouble("retry-s", 60));
  DELTASERVE_ASSIGN_OR_RETURN(double interval, flags.GetDouble("progress-interval", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t max_line_bytes, flags.GetInt("max-line-bytes", 0));
  if (flags.Has("max-line-bytes") && (max_line_bytes < 1 || max_line_bytes > kMaxLineBytesFlag)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-line-bytes must be in [1, ", kMaxLineBytesFlag, "]"));
  }
  // The default: what the longest prompt the model takes needs.
  auto line_bound = [&](const ModelConfig* config) {
    if (flags.Has("max-line-bytes")) return max_line_bytes;
    if (config == nullptr) return kDefaultMaxLineBytes;
    const int64_t context =
        std::min(config->max_position_embeddings, kMaxLineBytesFlag / kLineBytesPerToken);
    return std::max(kMinDefaultLineBytes, kLineBytesPerToken * context);
  };
  if (max_running < 1) return absl::InvalidArgumentError("--max-running must be >= 1");
  if (step_tokens < 1) return absl::InvalidArgumentError("--step-tokens must be >= 1");
  if (concurrency < 1 || concurrency > 4096) {
    return absl::InvalidArgumentError("--concurrency must be in [1, 4096]");
  }
  if (!(retry_s >= 0)) return absl::InvalidArgumentError("--retry-s must be >= 0");
  if (flags.Has("resume") && flags.Has("overwrite")) {
    return absl::InvalidArgumentError("give at most one of --resume, --overwrite");
  }
  if (flags.Has("retry-errors") && flags.Has("overwrite")) {
    return absl::InvalidArgumentError(
        "give at most one of --retry-errors, --overwrite (--overwrite runs every request again)");
  }
  const bool overwrite = flags.Has("overwrite");
  const bool retry_errors = flags.Has("retry-errors");
  BatchProgress progress(flags.Has("quiet"), interval);

  // The output first: a second job on the same file, or a file that is not
  // ours, fails before any model is loaded.
  auto open_output = [&]() -> absl::StatusOr<std::unique_ptr<BatchOutput>> {
    DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<BatchOutput> output,
                                BatchOutput::Open(output_path, overwrite, input, retry_errors));
    if (output->records_before() > 0 || output->cut_bytes() > 0 || output->retried() > 0) {
      std::fprintf(
          stderr, "batch: resuming %s: %lld records there%s%s\n", output_path.c_str(),
          static_cast<long long>(output->records_before()),
          output->retried() > 0
              ? absl::StrCat(", ", output->retried(), " error records dropped to run again").c_str()
              : "",
          output->cut_bytes() > 0
              ? absl::StrCat(", and an unfinished last line (", output->cut_bytes(), " bytes) cut")
                    .c_str()
              : "");
    }
    return output;
  };

  if (flags.Has("server")) {
    if (LaunchedUnderMpi()) {
      return absl::InvalidArgumentError(
          "--server runs as one process, not under mpirun/srun: the server's workers are the MPI "
          "job");
    }
    for (const char* local : {"pp", "tp", "stage-layers", "threads"}) {
      if (flags.Has(local)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", local,
                         " is for running the model here; with --server the "
                         "server's workers run it"));
      }
    }
    DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<BatchOutput> output, open_output());
    // With --model, requests are encoded and checked here as the embedded
    // run does, and sent as token ids.
    LoadedModel loaded;
    if (flags.Has("model")) {
      DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
      DELTASERVE_ASSIGN_OR_RETURN(loaded, LoadModel(flags.GetString("model"), config));
    }
    const BatchModel* model = loaded.model.get();
    DELTASERVE_ASSIGN_OR_RETURN(
        std::unique_ptr<BatchSource> source,
        BatchSource::Open(input, model, line_bound(model ? &model->config : nullptr), output.get(),
                          &progress));
    BatchClientOptions options;
    options.server = flags.GetString("server");
    options.security = ChannelSecurityFrom(flags, "token-file");
    options.concurrency = static_cast<int>(concurrency);
    options.retry_s = retry_s;
    const absl::Status status = RunBatchOnServer(options, *source, progress);
    progress.Summary(output_path, output->records_before(), output->errors_before(),
                     output->retried());
    return status;
  }

  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
  DELTASERVE_ASSIGN_OR_RETURN(Deployment deployment, Deploy(flags, config, plan_context));
  Replica& replica = *deployment.replica;
  if (!replica.is_leader()) return replica.Follow();

  // The leader reads the input and writes the output.
  absl::Status status = [&]() -> absl::Status {
    DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<BatchOutput> output, open_output());
    DELTASERVE_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(flags.GetString("model"), config));
    DELTASERVE_ASSIGN_OR_RETURN(
        std::unique_ptr<BatchSource> source,
        BatchSource::Open(input, loaded.model.get(), line_bound(&config), output.get(), &progress));
    SchedulerOptions options;
    options.max_running = max_running;
    options.step_tokens = step_tokens;
    options.pipeline_stages = deployment.layout.pp;
    options.cache_pages = replica.cache_pages();
    options.state_slots = replica.state_slots();
    const absl::Status run = RunBatchOnEngine(replica, *loaded.model, options, *source, progress);
    progress.Summary(output_path, output->records_before(), output->errors_before(),
                     output->retried());
    return run;
  }();
  // The other ranks return from Follow only when told.
  const absl::Status stopped = replica.Stop();
  DELTASERVE_RETURN_IF_ERROR(status);
  return stopped;
}

}  // namespace deltaserve
