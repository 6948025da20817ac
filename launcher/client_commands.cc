// client: a small gRPC client of the Generation API (generate, score, info,
// status), for people at a terminal, scripts and the e2e tests.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "deltaserve/v1/generation.grpc.pb.h"
#include "google/protobuf/util/json_util.h"
#include "launcher/channel_flags.h"
#include "launcher/commands.h"
#include "launcher/flags.h"
#include "launcher/prefill_bar.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/grpc_request.h"
#include "runtime/serving/grpc_status.h"

namespace deltaserve {
namespace {

absl::StatusOr<std::unique_ptr<v1::Generation::Stub>> Connect(const Flags& flags) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  DELTASERVE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                              OpenChannel(flags.GetString("server", "127.0.0.1:50051"),
                                          ChannelSecurityFrom(flags, "token-file"), args));
  return v1::Generation::NewStub(channel);
}

// A status the server (or the channel) answered: it carries the gRPC code's
// name, as scripts and people look for it. Errors of the command line itself
// are not dressed up this way: they are found before any call is made.
absl::Status FromRpc(const grpc::Status& rpc) {
  const absl::Status status = FromGrpc(rpc);
  if (status.ok()) return status;
  return absl::Status(
      status.code(), absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message()));
}

// --timeout S, checked before any call; 0 is no deadline.
absl::StatusOr<double> TimeoutFlag(const Flags& flags) {
  DELTASERVE_ASSIGN_OR_RETURN(double timeout, flags.GetDouble("timeout", 0));
  if (!(timeout >= 0)) return absl::InvalidArgumentError("--timeout must be >= 0");
  return timeout;
}

void SetDeadline(double timeout, grpc::ClientContext* context) {
  if (timeout > 0) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(timeout * 1e6)));
  }
}

// A reply as protobuf text format, or with --json as one line of proto3 JSON
// (the proto's field names; 64-bit integers are strings, as proto3 JSON has
// them; fields at their default value are printed too, so a script finds
// every key).
absl::Status PrintReply(const google::protobuf::Message& message, bool json) {
  if (!json) {
    std::printf("%s", message.DebugString().c_str());
    return absl::OkStatus();
  }
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  const auto converted = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!converted.ok()) {
    return absl::InternalError(
        absl::StrCat("the reply could not be written as JSON: ", converted.ToString()));
  }
  std::printf("%s\n", out.c_str());
  return absl::OkStatus();
}

// The prompt flags (PromptFlag) into the request's oneof.
template <typename Req>
absl::Status SetInput(const Flags& flags, Req* req) {
  DELTASERVE_ASSIGN_OR_RETURN(PromptArg input, PromptFlag(flags));
  if (input.is_chat) {
    ToProto(input.chat, req->mutable_chat());
  } else if (input.is_text) {
    req->set_text(std::move(input.text));
  } else {
    req->mutable_tokens()->mutable_ids()->Add(input.ids.begin(), input.ids.end());
  }
  return absl::OkStatus();
}

const char* FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_CONTEXT:
      return "context";
    default:
      return "unspecified";
  }
}

const FlagSpec kServerFlag = {"server", "HOST:PORT", "the server", "127.0.0.1:50051"};
const FlagSpec kTimeoutFlag = {"timeout", "S", "the request's deadline in seconds (0: none)", "0"};
const FlagSpec kJsonFlag = {"json", "", "print the reply as one line of JSON"};
const FlagSpec kProgressFlag = {
    "progress", "",
    "show the prefill's progress on stderr (tokens, rate, ETA) even when stderr is not a "
    "terminal (on one it is shown anyway)"};

// The bar is drawn where a person watches (stderr a terminal) or when asked.
PrefillBar BarFor(const Flags& flags) {
  return PrefillBar(flags.Has("progress") || ::isatty(STDERR_FILENO) == 1,
                    PrefillBar::Clock::now());
}

const CommandSpec& ClientGenerateSpec() {
  static const auto* spec = new CommandSpec{
      .name = "client generate",
      .summary = "stream a generation from a server",
      .usage = absl::StrCat("[--server HOST:PORT] ", kPromptUsage, " [flags]"),
      .flags = Concat(
          Concat({kServerFlag}, PromptFlags("the prompt")),
          Concat(
              {
                  {"max-tokens", "N", "tokens to generate at most (>= 1)", "32"},
                  {"temperature", "T", "0 is greedy", "0"},
                  {"top-k", "K", "sample among the K most likely tokens (0: all)", "0"},
                  {"top-p", "P", "sample within probability mass P, in (0, 1]", "1"},
                  {"seed", "S", "the same seed gives the same tokens", "0"},
                  {"stop", "STR", "a stop string (not part of the output)"},
                  {"stop-token-ids", "IDS", "token ids that end generation (part of the output)"},
                  {"request-id", "ID", "the request's id for Abort and logs"},
                  kTimeoutFlag,
                  {"top-logprobs", "N",
                   "print each token's log-prob and its N most likely alternatives to stderr "
                   "(0..20)",
                   "0"},
                  {"ids", "", "print token ids instead of text"},
                  {"ignore-eos", "", "do not stop at the tokenizer's end tokens"},
                  kProgressFlag,
              },
              ChannelSecurityFlags("token-file"))),
      .examples =
          {"deltaserve client generate --server 127.0.0.1:50051 --prompt hello --max-tokens 32"},
  };
  return *spec;
}

const CommandSpec& ClientScoreSpec() {
  static const auto* spec = new CommandSpec{
      .name = "client score",
      .summary = "per-token log-probs of a text or token sequence, one line per token",
      .usage = absl::StrCat("[--server HOST:PORT] ", kPromptUsage, " [--timeout S] [--progress]"),
      .flags = Concat(Concat({kServerFlag}, PromptFlags("the document to score")),
                      Concat(
                          {
                              kTimeoutFlag,
                              kProgressFlag,
                          },
                          ChannelSecurityFlags("token-file"))),
      .examples = {"deltaserve client score --server 127.0.0.1:50051 --tokens 1,2,3,4"},
  };
  return *spec;
}

const CommandSpec& ClientInfoSpec() {
  static const auto* spec = new CommandSpec{
      .name = "client info",
      .summary = "the served model (GetModelInfo)",
      .usage = "[--server HOST:PORT] [--json]",
      .flags = Concat({kServerFlag, kJsonFlag}, ChannelSecurityFlags("token-file")),
      .examples = {"deltaserve client info --server 127.0.0.1:50051",
                   "deltaserve client info --server 127.0.0.1:50051 --json"},
  };
  return *spec;
}

const CommandSpec& ClientStatusSpec() {
  static const auto* spec = new CommandSpec{
      .name = "client status",
      .summary =
          "what the server holds: queue, sequences, state bytes, your requests' prefill "
          "progress, each worker's fitted step cost (GetServerStatus)",
      .usage = "[--server HOST:PORT] [--json]",
      .flags = Concat({kServerFlag, kJsonFlag}, ChannelSecurityFlags("token-file")),
      .examples = {"deltaserve client status --server 127.0.0.1:50051",
                   "deltaserve client status --server 127.0.0.1:50051 --json"},
  };
  return *spec;
}

absl::Status ClientGenerate(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(ClientGenerateSpec(), args));
  v1::GenerateRequest req;
  DELTASERVE_RETURN_IF_ERROR(SetInput(flags, &req));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t max_tokens, flags.GetInt("max-tokens", 32));
  DELTASERVE_ASSIGN_OR_RETURN(double temperature, flags.GetDouble("temperature", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t top_k, flags.GetInt("top-k", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t top_logprobs, flags.GetInt("top-logprobs", 0));
  DELTASERVE_ASSIGN_OR_RETURN(const double timeout, TimeoutFlag(flags));
  // 0 is refused rather than sent: the API reads a max_tokens of 0 as unset
  // (its default, 16), which is not what asking for no tokens means.
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-tokens must be >= 1 (got ", max_tokens,
                                                   "); leave it out for the default 32"));
  }
  req.set_max_tokens(static_cast<int32_t>(max_tokens));
  req.mutable_sampling()->set_temperature(static_cast<float>(temperature));
  req.mutable_sampling()->set_top_k(static_cast<int32_t>(top_k));
  if (flags.Has("top-p")) {
    DELTASERVE_ASSIGN_OR_RETURN(double top_p, flags.GetDouble("top-p", 1));
    req.mutable_sampling()->set_top_p(static_cast<float>(top_p));
  }
  req.mutable_sampling()->set_seed(static_cast<uint64_t>(seed));
  if (flags.Has("stop")) req.add_stop(flags.GetString("stop"));
  if (flags.Has("stop-token-ids")) {
    DELTASERVE_ASSIGN_OR_RETURN(
        std::vector<int32_t> ids,
        ParseTokenList(flags.GetString("stop-token-ids"), "--stop-token-ids"));
    req.mutable_stop_token_ids()->Add(ids.begin(), ids.end());
  }
  req.set_request_id(flags.GetString("request-id"));
  req.set_top_logprobs(static_cast<int32_t>(top_logprobs));
  req.set_ignore_eos(flags.Has("ignore-eos"));
  const bool ids = flags.Has("ids");

  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<v1::Generation::Stub> stub, Connect(flags));
  grpc::ClientContext context;
  SetDeadline(timeout, &context);
  PrefillBar bar = BarFor(flags);
  auto reader = stub->Generate(&context, req);
  v1::GenerateResponse response;
  bool first = true;
  v1::Completion completion;
  while (reader->Read(&response)) {
    if (response.has_progress()) {
      bar.Update(response.progress().tokens_done(), response.progress().tokens_total());
    }
    if (response.tokens_size() > 0 || response.has_completion()) bar.Done();
    for (const auto& t : response.tokens()) {
      if (ids) {
        std::printf(first ? "%d" : " %d", t.id());
      } else {
        std::fputs(t.text().c_str(), stdout);
      }
      // Labelled, one line per token and one per alternative, so that a
      // reader (or grep) tells the token from its alternatives.
      if (t.top_logprobs_size() > 0) {
        std::fprintf(stderr, "token %d logprob %.4f\n", t.id(), t.logprob());
        for (int i = 0; i < t.top_logprobs_size(); ++i) {
          std::fprintf(stderr, "  top %d: token %d logprob %.4f\n", i + 1, t.top_logprobs(i).id(),
                       t.top_logprobs(i).logprob());
        }
      }
      first = false;
    }
    std::fflush(stdout);
    if (response.has_completion()) completion = response.completion();
  }
  bar.Done();
  const absl::Status finished = FromRpc(reader->Finish());
  // The output is a line: ended when the call succeeded or tokens were
  // printed, and nothing at all on stdout for a call that failed before any.
  if (finished.ok() || !first) std::printf("\n");
  std::fflush(stdout);
  DELTASERVE_RETURN_IF_ERROR(finished);
  const auto& t = completion.timings();
  const double decode = t.total_s() - t.time_to_first_token_s();
  const int64_t n = completion.usage().completion_tokens();
  std::fprintf(
      stderr,
      "finish: %s%s%s, prompt tokens: %lld (%lld cached), generated: %lld, queue: %.1f ms, "
      "time to first token: %.1f ms, total: %.1f ms, decode: %.1f tokens/s\n",
      FinishName(completion.finish_reason()), completion.stop().empty() ? "" : " at ",
      completion.stop().c_str(), static_cast<long long>(completion.usage().prompt_tokens()),
      static_cast<long long>(completion.usage().cached_tokens()), static_cast<long long>(n),
      t.queue_s() * 1e3, t.time_to_first_token_s() * 1e3, t.total_s() * 1e3,
      n > 1 && decode > 0 ? (n - 1) / decode : 0.0);
  return absl::OkStatus();
}

absl::Status ClientScore(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(ClientScoreSpec(), args));
  v1::ScoreRequest req;
  DELTASERVE_RETURN_IF_ERROR(SetInput(flags, &req));
  DELTASERVE_ASSIGN_OR_RETURN(const double timeout, TimeoutFlag(flags));
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<v1::Generation::Stub> stub, Connect(flags));
  grpc::ClientContext context;
  SetDeadline(timeout, &context);
  PrefillBar bar = BarFor(flags);
  auto reader = stub->ScoreStream(&context, req);
  v1::ScoreStreamResponse message;
  v1::ScoreResponse response;
  bool got_result = false;
  while (reader->Read(&message)) {
    if (message.has_progress()) {
      bar.Update(message.progress().tokens_done(), message.progress().tokens_total());
    }
    if (message.has_result()) {
      response = std::move(*message.mutable_result());
      got_result = true;
    }
  }
  bar.Done();
  DELTASERVE_RETURN_IF_ERROR(FromRpc(reader->Finish()));
  // The server's answer, checked before it is indexed: one log-prob per
  // token after the first.
  if (!got_result || response.token_ids_size() == 0 ||
      response.logprobs_size() != response.token_ids_size() - 1) {
    return absl::DataLossError(absl::StrCat(
        "the server's ScoreStream ended without a whole result (", response.token_ids_size(),
        " tokens, ", response.logprobs_size(), " log-probs)"));
  }
  for (int i = 0; i < response.logprobs_size(); ++i) {
    std::printf("%d %.6f\n", response.token_ids(i + 1), response.logprobs(i));
  }
  std::fprintf(stderr, "tokens: %d, total log-prob: %.6f, time: %.1f ms\n",
               response.token_ids_size(), response.total_logprob(),
               response.timings().total_s() * 1e3);
  return absl::OkStatus();
}

absl::Status ClientInfo(const Args& args, bool status) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags,
                              Flags::Parse(status ? ClientStatusSpec() : ClientInfoSpec(), args));
  const bool json = flags.Has("json");
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<v1::Generation::Stub> stub, Connect(flags));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (status) {
    v1::ServerStatus response;
    DELTASERVE_RETURN_IF_ERROR(
        FromRpc(stub->GetServerStatus(&context, v1::GetServerStatusRequest(), &response)));
    return PrintReply(response, json);
  }
  v1::ModelInfo response;
  DELTASERVE_RETURN_IF_ERROR(
      FromRpc(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &response)));
  return PrintReply(response, json);
}

}  // namespace

const CommandSpec& ClientSpec() {
  static const auto* spec = new CommandSpec{
      .name = "client",
      .summary = "a gRPC client of a running server: generate, score, info, status",
      .usage = "COMMAND [--server HOST:PORT] [flags]",
      .examples = {"deltaserve client generate --server 127.0.0.1:50051 --prompt hello",
                   "deltaserve client status --server 127.0.0.1:50051"},
      .details =
          "Errors the server answers carry the gRPC code's name (INVALID_ARGUMENT: ...); a "
          "mistake on the command line (an unknown flag, a bad value) is reported before any "
          "call is made, without one.",
      .subcommands = {&ClientGenerateSpec(), &ClientScoreSpec(), &ClientInfoSpec(),
                      &ClientStatusSpec()},
  };
  return *spec;
}

namespace {

absl::Status RunClientCommand(const Args& args) {
  if (args.empty()) {
    return absl::InvalidArgumentError("client: give a subcommand: generate, score, info, status");
  }
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "generate") return ClientGenerate(rest);
  if (args[0] == "score") return ClientScore(rest);
  if (args[0] == "info") return ClientInfo(rest, false);
  if (args[0] == "status") return ClientInfo(rest, true);
  return absl::InvalidArgumentError(
      absl::StrCat("client: unknown subcommand '", args[0], "': generate, score, info, status"));
}

}  // namespace

// The server's errors carry the gRPC code's name (FromRpc); the command
// line's are the usage errors every command reports.
absl::Status RunClient(const Args& args) { return RunClientCommand(args); }

}  // namespace deltaserve
