// make-model, generate and score: the single-process tools.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "launcher/commands.h"
#include "launcher/deployment.h"
#include "launcher/flags.h"
#include "runtime/common/checked_product.h"
#include "runtime/common/file_util.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/model.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/model/safetensors.h"
#include "runtime/scheduler/offline_engine.h"
#include "runtime/tokenizer/chat_format.h"
#include "runtime/tokenizer/text_stream.h"
#include "runtime/tokenizer/tokenizer.h"

namespace deltaserve {
namespace {

// The prompt's token ids: given, its text encoded by the model's tokenizer
// (runtime/tokenizer: the checkpoint's tiktoken BPE, or bytes), or a
// conversation rendered by the model's chat format. To generate (`end_ids`
// given), the conversation ends with the assistant's generation prompt and
// the format's end-of-turn tokens go to `end_ids`; to score, it is scored as
// it stands.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const Flags& flags, const ModelConfig& config,
                                                  std::vector<int32_t>* end_ids = nullptr) {
  DELTASERVE_ASSIGN_OR_RETURN(PromptArg input, PromptFlag(flags));
  input.chat.add_generation_prompt = end_ids != nullptr;
  if (!input.is_text && !input.is_chat) return std::move(input.ids);
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                              LoadTokenizer(flags.GetString("model"), config.vocab_size));
  if (input.is_chat) {
    const std::string source = "--messages-file " + flags.GetString("messages-file");
    DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<ChatFormat> format,
                                LoadChatFormat(flags.GetString("model")));
    auto segments = format->Render(input.chat);
    if (!segments.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", segments.status().message()));
    }
    for (const std::string& token : format->end_tokens()) {
      auto id = tokenizer->Encode(token, /*allow_special=*/true);
      if (end_ids != nullptr && id.ok() && id->size() == 1) end_ids->push_back((*id)[0]);
    }
    return EncodeChat(*segments, *tokenizer);
  }
  auto tokens = tokenizer->Encode(input.text);
  if (!tokens.ok()) {
    const std::string source =
        flags.Has("prompt") ? "--prompt" : "--prompt-file " + flags.GetString("prompt-file");
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", tokens.status().message()));
  }
  return *tokens;
}

}  // namespace

const CommandSpec& MakeModelSpec() {
  static const auto* spec = new CommandSpec{
      .name = "make-model",
      .summary =
          "write a random checkpoint in the real layouts (bf16, the f32 exceptions, "
          "MXFP4 experts on request)",
      .usage = "(--preset NAME | --config FILE) --out DIR [--seed N] [--experts bf16|mxfp4]",
      .flags =
          {
              {"preset", "NAME",
               "k3-tiny, kimi-linear-tiny, k3-small (~100M parameters) or k3-moe-small "
               "(~850M, K3's mixture: 128 experts, 8 active)"},
              {"config", "FILE", "any shape: a config.json of either architecture"},
              {"out", "DIR", "where config.json and model.safetensors go"},
              {"seed", "N", "random seed of the weights", "0"},
              {"experts", "FORMAT",
               "routed experts as bf16, or mxfp4 as real K3 stores them (weight_packed + "
               "weight_scale, quantization_config in config.json; rows of a multiple of 32)",
               "bf16"},
          },
      .examples =
          {"deltaserve make-model --preset k3-tiny --out /tmp/k3-tiny",
           "deltaserve make-model --preset k3-small --experts mxfp4 --out /tmp/k3-small-mxfp4"},
  };
  return *spec;
}

absl::Status RunMakeModel(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(MakeModelSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(std::string out, flags.Required("out"));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0));
  ModelConfig config;
  if (flags.Has("preset") == flags.Has("config")) {
    return absl::InvalidArgumentError("give exactly one of --preset, --config");
  }
  if (flags.Has("preset")) {
    const std::string preset = flags.GetString("preset");
    for (const std::string& full : FullSizePresetNames()) {
      if (preset == full) {
        return absl::InvalidArgumentError(
            absl::StrCat("--preset ", preset,
                         " is the full-size model, for `deltaserve plan`: its checkpoint "
                         "is terabytes; make-model writes ",
                         absl::StrJoin(PresetNames(), ", ")));
      }
    }
    DELTASERVE_ASSIGN_OR_RETURN(config, PresetConfig(preset));
  } else {
    const std::string path = flags.GetString("config");
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    std::stringstream text;
    text << in.rdbuf();
    DELTASERVE_ASSIGN_OR_RETURN(config, ParseModelConfig(text.str(), path));
  }
  auto experts = ParseExpertFormat(flags.GetString("experts", "bf16"));
  if (!experts.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--experts: ", experts.status().message()));
  }
  config = WithExpertFormat(std::move(config), *experts);
  DELTASERVE_RETURN_IF_ERROR(WriteRandomCheckpoint(config, out, static_cast<uint64_t>(seed)));
  const std::string expert_note =
      config.num_experts > 0 ? absl::StrCat(", ", ExpertFormatName(*experts), " routed experts")
                             : "";
  std::fprintf(stderr, "wrote %s (%s, %lld layers, hidden %lld%s)\n", out.c_str(),
               config.model_type.c_str(), static_cast<long long>(config.num_layers),
               static_cast<long long>(config.hidden_size), expert_note.c_str());
  return absl::OkStatus();
}

namespace {

constexpr char kDistributedNote[] =
    "Under mpirun or srun (or with --pp/--tp) this runs as an MPI job of pp x tp ranks: rank 0\n"
    "drives the steps and prints, the others follow (docs/deployment.md).";

}  // namespace

const CommandSpec& GenerateSpec() {
  static const auto* spec = new CommandSpec{
      .name = "generate",
      .summary = "stream a generation to stdout; timings to stderr",
      .usage = absl::StrCat("--model DIR ", kPromptUsage, " [flags]"),
      .flags = Concat(
          Concat(DeploymentFlags(), PromptFlags("the prompt")),
          {
              {"max-tokens", "N", "tokens to generate at most (>= 1)", "32"},
              {"temperature", "T", "0 is greedy", "0"},
              {"top-k", "K", "sample among the K most likely tokens (0: all)", "0"},
              {"top-p", "P", "sample within probability mass P, in (0, 1]", "1"},
              {"seed", "S", "the same seed gives the same tokens on any machine", "0"},
              {"prefill-chunk", "N", "feed the prompt in pieces of N tokens (0: in one piece)",
               "0"},
              {"ids", "", "print token ids instead of text"},
              {"stats", "",
               "print each rank's weight bytes by dtype, checkpoint bytes and pipeline traffic"},
              {"ignore-eos", "", "do not stop at the tokenizer's end tokens"},
          }),
      .examples = {"deltaserve generate --model /tmp/k3-tiny --prompt hello --max-tokens 32",
                   "deltaserve generate --model /tmp/k3-tiny --tokens 1,2,3 --temperature 0.8 "
                   "--seed 5 --ids",
                   "mpirun -np 4 deltaserve generate --pp 2 --tp 2 --model DIR --prompt hello"},
      .details = kDistributedNote,
  };
  return *spec;
}

absl::Status RunGenerate(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(GenerateSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
  SequenceRequest request;
  request.kind = SequenceKind::kGenerate;
  std::vector<int32_t> chat_end_ids;  // a conversation's end-of-turn tokens
  DELTASERVE_ASSIGN_OR_RETURN(request.prompt, PromptTokens(flags, config, &chat_end_ids));
  DELTASERVE_ASSIGN_OR_RETURN(request.max_tokens, flags.GetInt("max-tokens", 32));
  DELTASERVE_ASSIGN_OR_RETURN(double temperature, flags.GetDouble("temperature", 0.0));
  DELTASERVE_ASSIGN_OR_RETURN(request.sampling.top_k, flags.GetInt("top-k", 0));
  DELTASERVE_ASSIGN_OR_RETURN(double top_p, flags.GetDouble("top-p", 1.0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t chunk, flags.GetInt("prefill-chunk", 0));
  // 0 is refused, as `client generate` and the Python client refuse it: over
  // the API a max_tokens of 0 reads as unset, so no command can mean "none" by it.
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-tokens must be >= 1 (got ",
                                                   request.max_tokens,
                                                   "); leave it out for the default 32"));
  }
  if (!(temperature >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
  if (request.sampling.top_k < 0) return absl::InvalidArgumentError("--top-k must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) return absl::InvalidArgumentError("--top-p must be in (0, 1]");
  if (chunk < 0) return absl::InvalidArgumentError("--prefill-chunk must be >= 0");
  request.sampling.temperature = static_cast<float>(temperature);
  request.sampling.top_p = static_cast<float>(top_p);
  request.seed = static_cast<uint64_t>(seed);
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());

  DELTASERVE_ASSIGN_OR_RETURN(Deployment deployment,
                              Deploy(flags, config, prompt_tokens + request.max_tokens));
  Replica& replica = *deployment.replica;
  if (!replica.is_leader()) {
    DELTASERVE_RETURN_IF_ERROR(replica.Follow());
    if (flags.Has("stats")) PrintPipelineStats(deployment);
    return absl::OkStatus();
  }
  // Text through the model's tokenizer, UTF-8 split across tokens held until
  // whole; token ids with --ids, or when the model has no tokenizer.
  // Generation ends at the tokenizer's end tokens (as over the API) unless
  // --ignore-eos.
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto loaded = LoadTokenizer(flags.GetString("model"), config.vocab_size); loaded.ok()) {
    tokenizer = std::move(*loaded);
    if (!flags.Has("ignore-eos")) {
      request.stop_ids = tokenizer->end_ids();
      request.stop_ids.insert(request.stop_ids.end(), chat_end_ids.begin(), chat_end_ids.end());
    }
  }
  std::optional<TextStream> text;
  if (tokenizer && !flags.Has("ids")) text.emplace(*tokenizer, std::vector<std::string>{});

  SchedulerOptions options;
  // The whole prompt in one step, or in pieces of --prefill-chunk tokens.
  options.step_tokens = chunk > 0 ? chunk : std::max<int64_t>(prompt_tokens, 1);
  options.fixed_chunk = options.step_tokens;
  options.pipeline_stages = deployment.layout.pp;
  options.cache_pages = replica.cache_pages();
  options.state_slots = replica.state_slots();
  OfflineEngine engine(replica, config, options);
  if (request.max_tokens > 0) engine.Add(std::move(request));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point first;
  int64_t generated = 0;
  absl::Status failed = absl::OkStatus();
  DELTASERVE_RETURN_IF_ERROR(engine.Run([&](const SchedulerEvent& e) {
    if (e.kind == SchedulerEvent::Kind::kFailed) failed = e.status;
    if (e.kind != SchedulerEvent::Kind::kToken) return;
    if (generated++ == 0) first = Clock::now();
    if (text) {
      std::fputs(text->Add(e.output.token, e.finished).text.c_str(), stdout);
    } else {
      std::printf(generated == 1 ? "%d" : " %d", e.output.token);
    }
    std::fflush(stdout);
  }));
  DELTASERVE_RETURN_IF_ERROR(replica.Stop());
  DELTASERVE_RETURN_IF_ERROR(failed);
  if (flags.Has("stats")) PrintPipelineStats(deployment);
  std::printf("\n");
  std::fflush(stdout);
  const auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const double ttft = generated > 0 ? seconds(start, first) : 0.0;
  const double decode_s = generated > 0 ? seconds(first, Clock::now()) : 0.0;
  const double decode_rate = generated > 1 && decode_s > 0 ? (generated - 1) / decode_s : 0.0;
  // The prefill rate is measured to the first token; with none (a stop at
  // once cannot happen, but a failure can) there is no rate to print.
  const std::string prefill_rate =
      generated > 0 && ttft > 0 ? absl::StrFormat("%.1f tokens/s", prompt_tokens / ttft) : "-";
  std::fprintf(stderr,
               "prompt tokens: %lld, generated: %lld, time to first token: %.1f ms, "
               "prefill: %s, decode: %.1f tokens/s\n",
               static_cast<long long>(prompt_tokens), static_cast<long long>(generated), ttft * 1e3,
               prefill_rate.c_str(), decode_rate);
  return absl::OkStatus();
}

namespace {

// --logits-out holds [T, vocab] float32 whole (and writes it); above this it
// refuses and points to --logprobs-out, which holds one piece at a time.
constexpr int64_t kDefaultMaxLogitsBytes = int64_t{1} << 30;
// --logprobs-out's pieces when --prefill-chunk is 0: as many tokens as keep
// a piece's logits [piece, vocab] float32 within this, and at least
// kMinScorePiece tokens (so that a large vocabulary still prefills in
// pieces worth a step).
constexpr int64_t kScorePieceLogitsBytes = int64_t{4} << 20;
constexpr int64_t kMinScorePiece = 64;

// T x vocab x 4, or nullopt when that product overflows int64.
std::optional<int64_t> LogitsBytes(int64_t tokens, int64_t vocab) {
  int64_t values = 0, bytes = 0;
  if (__builtin_mul_overflow(tokens, vocab, &values) ||
      __builtin_mul_overflow(values, int64_t{4}, &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

std::vector<uint8_t> LittleEndianBytes(const std::vector<int64_t>& values) {
  std::vector<uint8_t> bytes(values.size() * 8);
  for (size_t i = 0; i < values.size(); ++i) std::memcpy(bytes.data() + 8 * i, &values[i], 8);
  return bytes;
}

}  // namespace

const CommandSpec& ScoreSpec() {
  static const auto* spec = new CommandSpec{
      .name = "score",
      .summary =
          "per-token log-probs, or the logits of every prompt position, to a safetensors file",
      .usage = absl::StrCat("--model DIR ", kPromptUsage,
                            " (--logprobs-out F | --logits-out F) [flags]"),
      .flags =
          Concat(Concat(DeploymentFlags(), PromptFlags("the document to score")),
                 {
                     {"logprobs-out", "FILE",
                      "writes `logprobs` [T-1] F32 (log p(token i+1 | tokens 0..i)), `tokens` "
                      "[T] I64, and with --top-k `top_ids` [T-1, K] I32 and `top_logprobs` "
                      "[T-1, K] F32; holds one piece's logits at a time"},
                     {"top-k", "K",
                      "with --logprobs-out: the K most likely tokens at each "
                      "position too (0: none)",
                      "0"},
                     {"logits-out", "FILE",
                      "writes `logits` [T, vocab] F32, `tokens` [T] I64 (held whole: refused "
                      "above --max-logits-bytes)"},
                     {"max-logits-bytes", "B",
                      "the most --logits-out may hold (T x vocab x 4 bytes)", "1073741824"},
                     {"prefill-chunk", "N",
                      "prefill in pieces of N tokens (0: one piece for --logits-out; for "
                      "--logprobs-out pieces whose logits fit in 4 MiB, at least 64 tokens)",
                      "0"},
                     {"decode-from", "K", "prefill the first K tokens, then one per step", "0"},
                     {"window", "N",
                      "with --logprobs-out: score the document as independent windows of N "
                      "tokens (the last may be shorter), each from an empty state, as a "
                      "perplexity evaluation at context N does; `logprobs` then holds each "
                      "window's log-probs in turn, one fewer than its tokens (0: one window)",
                      "0"},
                     {"stats", "",
                      "print each rank's traffic, the tokens/s and the largest logits buffer"},
                 }),
      .examples =
          {"deltaserve score --model /tmp/k3-tiny --tokens-file doc.txt --top-k 5 "
           "--logprobs-out lp.safetensors",
           "deltaserve score --model /tmp/k3-tiny --prompt-file doc.txt --window 256 "
           "--logprobs-out lp.safetensors",
           "deltaserve score --model /tmp/k3-tiny --tokens 1,2,3 --logits-out out.safetensors"},
      .details = absl::StrCat(
          "A long document: --logprobs-out computes each piece's logits, keeps the targets'\n"
          "log-probs (and the top K) and drops the rest, so memory does not grow with T x vocab.\n"
          "--logits-out holds all of them and refuses when T x vocab x 4 bytes is above\n"
          "--max-logits-bytes (docs/numerics.md).\n\n",
          kDistributedNote),
  };
  return *spec;
}

absl::Status RunScore(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(ScoreSpec(), args));
  if (flags.Has("logits-out") == flags.Has("logprobs-out")) {
    return absl::InvalidArgumentError("give exactly one of --logprobs-out, --logits-out");
  }
  const bool want_logits = flags.Has("logits-out");
  const std::string out = flags.GetString(want_logits ? "logits-out" : "logprobs-out");
  // Before the model runs; WriteFileAtomically checks again when it writes.
  if (absl::Status s = CheckOutputPath(out); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat(want_logits ? "--logits-out: " : "--logprobs-out: ", s.message()));
  }
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
  SequenceRequest request;
  request.kind = want_logits ? SequenceKind::kLogits : SequenceKind::kScore;
  DELTASERVE_ASSIGN_OR_RETURN(request.prompt, PromptTokens(flags, config));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t chunk, flags.GetInt("prefill-chunk", 0));
  DELTASERVE_ASSIGN_OR_RETURN(request.decode_from, flags.GetInt("decode-from", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t top_k, flags.GetInt("top-k", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t max_logits_bytes,
                              flags.GetInt("max-logits-bytes", kDefaultMaxLogitsBytes));
  if (chunk < 0) return absl::InvalidArgumentError("--prefill-chunk must be >= 0");
  if (request.decode_from < 0) return absl::InvalidArgumentError("--decode-from must be >= 0");
  if (max_logits_bytes < 0) return absl::InvalidArgumentError("--max-logits-bytes must be >= 0");
  if (top_k < 0 || top_k > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-k must be in [0, vocab_size ", config.vocab_size, "]"));
  }
  if (top_k > 0 && want_logits) {
    return absl::InvalidArgumentError("--top-k goes with --logprobs-out, not --logits-out");
  }
  request.top_logprobs = static_cast<int32_t>(top_k);
  DELTASERVE_ASSIGN_OR_RETURN(int64_t window, flags.GetInt("window", 0));
  if (window < 0) return absl::InvalidArgumentError("--window must be >= 0");
  if (window > 0 && want_logits) {
    return absl::InvalidArgumentError("--window goes with --logprobs-out, not --logits-out");
  }
  if (window > 0 && request.decode_from > 0) {
    return absl::InvalidArgumentError("--window and --decode-from do not go together");
  }
  const int64_t T = static_cast<int64_t>(request.prompt.size());
  if (window == 0) window = std::max<int64_t>(T, 1);
  const int64_t vocab = config.vocab_size;
  if (want_logits) {
    const std::optional<int64_t> bytes = LogitsBytes(T, vocab);
    if (!bytes || *bytes > max_logits_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "--logits-out would hold ",
          bytes ? absl::StrCat(*bytes, " bytes") : std::string("more than 2^63 bytes"),
          " of logits (T x vocab = ", T, " x ", vocab, " float32), above --max-logits-bytes ",
          max_logits_bytes,
          "; --logprobs-out FILE writes each token's log-prob (and --top-k K alternatives) "
          "holding one piece's logits at a time"));
    }
  }
  if (chunk == 0) {
    chunk = want_logits ? std::max<int64_t>(T, 1)
                        : std::max(kMinScorePiece, kScorePieceLogitsBytes / (4 * vocab));
  }
  DELTASERVE_ASSIGN_OR_RETURN(Deployment deployment, Deploy(flags, config, std::min(T, window)));
  Replica& replica = *deployment.replica;
  if (!replica.is_leader()) {
    DELTASERVE_RETURN_IF_ERROR(replica.Follow());
    if (flags.Has("stats")) PrintPipelineStats(deployment);
    return absl::OkStatus();
  }
  SchedulerOptions options;
  options.step_tokens = chunk;
  options.fixed_chunk = chunk;
  options.pipeline_stages = deployment.layout.pp;
  options.cache_pages = replica.cache_pages();
  options.state_slots = replica.state_slots();
  OfflineEngine engine(replica, config, options);
  // One sequence per window, id = its index; each collects its own pieces.
  // The windows copy the request without the whole prompt.
  const std::vector<int32_t> tokens = std::move(request.prompt);
  request.prompt.clear();
  struct Scored {
    std::vector<float> logits, logprobs, top_logprobs;
    std::vector<int32_t> top_ids;
  };
  const int64_t windows = T == 0 ? 1 : 1 + (T - 1) / window;  // no overflow for any window
  std::vector<Scored> scored_windows(static_cast<size_t>(windows));
  for (int64_t w = 0; w < windows; ++w) {
    SequenceRequest piece = request;
    piece.id = static_cast<uint64_t>(w);
    piece.prompt.assign(tokens.begin() + std::min(T, w * window),
                        tokens.begin() + std::min(T, (w + 1) * window));
    engine.Add(std::move(piece));
  }
  const auto start = std::chrono::steady_clock::now();
  if (want_logits) scored_windows[0].logits.reserve(static_cast<size_t>(T * vocab));
  absl::Status failed = absl::OkStatus();
  DELTASERVE_RETURN_IF_ERROR(engine.Run([&](const SchedulerEvent& e) {
    if (e.kind == SchedulerEvent::Kind::kFailed) failed = e.status;
    if (e.kind != SchedulerEvent::Kind::kPiece || e.id >= scored_windows.size()) return;
    const SequenceResult& r = e.output;
    Scored& s = scored_windows[e.id];
    s.logits.insert(s.logits.end(), r.logits.begin(), r.logits.end());
    s.logprobs.insert(s.logprobs.end(), r.target_logprobs.begin(), r.target_logprobs.end());
    s.top_ids.insert(s.top_ids.end(), r.top_ids.begin(), r.top_ids.end());
    s.top_logprobs.insert(s.top_logprobs.end(), r.top_logprobs.begin(), r.top_logprobs.end());
  }));
  DELTASERVE_RETURN_IF_ERROR(replica.Stop());
  DELTASERVE_RETURN_IF_ERROR(failed);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (flags.Has("stats")) {
    PrintPipelineStats(deployment);
    // The logits live on the last stage: this rank's count when it is that
    // stage (one process, or pp 1).
    std::string logits_note;
    if (deployment.executor->is_output()) {
      const int64_t peak = deployment.executor->stage().stats().peak_logits_bytes;
      logits_note =
          absl::StrCat("; largest logits buffer ", peak, " bytes (",
                       absl::StrFormat("%.1f", peak / (4.0 * vocab)), " rows of ", vocab, ")");
    }
    std::fprintf(stderr, "score: %lld tokens in %.3f s (%.1f tokens/s)%s\n",
                 static_cast<long long>(T), seconds, T / std::max(seconds, 1e-9),
                 logits_note.c_str());
  }
  const std::vector<uint8_t> token_bytes =
      LittleEndianBytes(std::vector<int64_t>(tokens.begin(), tokens.end()));
  if (want_logits) {
    return WriteSafetensors(out, {MakeF32Tensor("logits", {T, vocab}, scored_windows[0].logits),
                                  TensorData{"tokens", DType::kI64, {T}, token_bytes}});
  }
  // A row per prompt token of each window; its last has no next token to score.
  std::vector<float> logprobs, top_logprobs;
  std::vector<int32_t> top_ids;
  for (int64_t w = 0; w < windows; ++w) {
    Scored& s = scored_windows[static_cast<size_t>(w)];
    const int64_t length = std::min(T, (w + 1) * window) - std::min(T, w * window);
    if (static_cast<int64_t>(s.logprobs.size()) != length ||
        static_cast<int64_t>(s.top_ids.size()) != length * top_k) {
      return absl::InternalError(absl::StrCat("score: ", s.logprobs.size(), " log-probs and ",
                                              s.top_ids.size(), " top ids for ", length,
                                              " tokens"));
    }
    const int64_t kept = std::max<int64_t>(length - 1, 0);
    logprobs.insert(logprobs.end(), s.logprobs.begin(), s.logprobs.begin() + kept);
    top_ids.insert(top_ids.end(), s.top_ids.begin(), s.top_ids.begin() + kept * top_k);
    top_logprobs.insert(top_logprobs.end(), s.top_logprobs.begin(),
                        s.top_logprobs.begin() + kept * top_k);
  }
  const int64_t scored = static_cast<int64_t>(logprobs.size());
  std::vector<TensorData> tensors = {MakeF32Tensor("logprobs", {scored}, logprobs),
                                     TensorData{"tokens", DType::kI64, {T}, token_bytes}};
  if (top_k > 0) {
    std::vector<uint8_t> id_bytes(top_ids.size() * 4);
    std::memcpy(id_bytes.data(), top_ids.data(), id_bytes.size());
    tensors.push_back(TensorData{"top_ids", DType::kI32, {scored, top_k}, std::move(id_bytes)});
    tensors.push_back(MakeF32Tensor("top_logprobs", {scored, top_k}, top_logprobs));
  }
  return WriteSafetensors(out, tensors);
}

}  // namespace deltaserve
