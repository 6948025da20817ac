// serve, coordinator and worker: the serving processes.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "launcher/commands.h"
#include "launcher/deployment.h"
#include "launcher/flags.h"
#include "runtime/common/file_util.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/local_worker.h"
#include "runtime/serving/server.h"
#include "runtime/serving/worker.h"

namespace deltaserve {
namespace {

// Limits on what one request may cost (docs/security-limits.md).
std::vector<FlagSpec> LimitFlags() {
  const RequestLimits l;
  return {
      {"max-request-bytes", "N", "a request's text, or its token ids at 4 bytes each",
       absl::StrCat(l.max_request_bytes)},
      {"max-text-bytes-per-token", "N",
       "text over N bytes per token of the model's context is refused before tokenizing",
       absl::StrCat(l.max_text_bytes_per_token)},
      {"max-stop-token-ids", "N", "stop_token_ids entries per request",
       absl::StrCat(l.max_stop_token_ids)},
      {"max-concurrent-tokenizations", "N", "texts tokenized at once; more get RESOURCE_EXHAUSTED",
       absl::StrCat(l.max_concurrent_tokenizations)},
      {"client-write-timeout", "S",
       "cancel a stream whose client has not read for S seconds, freeing its sequence",
       absl::StrCat(l.client_write_timeout_s)},
  };
}

absl::StatusOr<RequestLimits> LimitsFrom(const Flags& flags) {
  RequestLimits l;
  DELTASERVE_ASSIGN_OR_RETURN(l.max_request_bytes,
                              flags.GetInt("max-request-bytes", l.max_request_bytes));
  DELTASERVE_ASSIGN_OR_RETURN(l.max_text_bytes_per_token,
                              flags.GetInt("max-text-bytes-per-token", l.max_text_bytes_per_token));
  DELTASERVE_ASSIGN_OR_RETURN(l.max_stop_token_ids,
                              flags.GetInt("max-stop-token-ids", l.max_stop_token_ids));
  DELTASERVE_ASSIGN_OR_RETURN(
      l.max_concurrent_tokenizations,
      flags.GetInt("max-concurrent-tokenizations", l.max_concurrent_tokenizations));
  DELTASERVE_ASSIGN_OR_RETURN(l.client_write_timeout_s,
                              flags.GetDouble("client-write-timeout", l.client_write_timeout_s));
  auto at_least = [](int64_t value, int64_t min, const char* flag) {
    return value >= min ? absl::OkStatus()
                        : absl::InvalidArgumentError(absl::StrCat("--", flag, " must be >= ", min));
  };
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_request_bytes, 1, "max-request-bytes"));
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_text_bytes_per_token, 1, "max-text-bytes-per-token"));
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_stop_token_ids, 0, "max-stop-token-ids"));
  DELTASERVE_RETURN_IF_ERROR(
      at_least(l.max_concurrent_tokenizations, 1, "max-concurrent-tokenizations"));
  if (!(l.client_write_timeout_s > 0 && l.client_write_timeout_s <= 86400)) {
    return absl::InvalidArgumentError("--client-write-timeout must be in (0, 86400] seconds");
  }
  return l;
}

// The flags of serve and coordinator; `host` is their different default.
std::vector<FlagSpec> ServerFlags(const std::string& host) {
  const ServerOptions o;
  const CoordinatorOptions& c = o.coordinator;
  return Concat(
      {
          {"model", "DIR", "the model directory (config.json, tokenizer files)"},
          {"host", "ADDR", "the address to listen on", host},
          {"port", "N", "the gRPC port (0: any free one, see --port-file)", absl::StrCat(o.port)},
          {"metrics-port", "N", "serve Prometheus /metrics on this port (-1: none; 0: any free)",
           "-1"},
          {"port-file", "F", "write the gRPC port, then the metrics port, to F once listening"},
          {"max-running", "N", "sequences holding state per worker", absl::StrCat(c.max_running)},
          {"max-waiting", "N", "requests queued behind them (then RESOURCE_EXHAUSTED)",
           absl::StrCat(c.max_waiting)},
          {"max-waiting-tokens", "N", "prompt tokens queued", absl::StrCat(c.max_waiting_tokens)},
          {"step-tokens", "N", "token budget of one step", absl::StrCat(c.step_tokens)},
      },
      LimitFlags());
}

// Blocks SIGINT and SIGTERM in this thread and every thread started after
// it, so that WaitForSignal (sigwait) is where they arrive.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForSignal(const sigset_t& set) {
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

absl::StatusOr<ServerOptions> ServerOptionsFrom(const Flags& flags, const std::string& host) {
  ServerOptions o;
  DELTASERVE_ASSIGN_OR_RETURN(o.model_dir, flags.Required("model"));
  o.host = flags.GetString("host", host);
  DELTASERVE_ASSIGN_OR_RETURN(int64_t port, flags.GetInt("port", 50051));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t metrics_port, flags.GetInt("metrics-port", -1));
  if (port < 0 || port > 65535) return absl::InvalidArgumentError("--port must be in [0, 65535]");
  if (metrics_port < -1 || metrics_port > 65535) {
    return absl::InvalidArgumentError("--metrics-port must be in [0, 65535] (or -1: none)");
  }
  o.port = static_cast<int>(port);
  o.metrics_port = static_cast<int>(metrics_port);
  CoordinatorOptions& c = o.coordinator;
  DELTASERVE_ASSIGN_OR_RETURN(c.max_running, flags.GetInt("max-running", c.max_running));
  DELTASERVE_ASSIGN_OR_RETURN(c.max_waiting, flags.GetInt("max-waiting", c.max_waiting));
  DELTASERVE_ASSIGN_OR_RETURN(c.max_waiting_tokens,
                              flags.GetInt("max-waiting-tokens", c.max_waiting_tokens));
  DELTASERVE_ASSIGN_OR_RETURN(c.step_tokens, flags.GetInt("step-tokens", c.step_tokens));
  DELTASERVE_ASSIGN_OR_RETURN(o.limits, LimitsFrom(flags));
  if (c.max_running < 1) return absl::InvalidArgumentError("--max-running must be >= 1");
  if (c.max_waiting < 0) return absl::InvalidArgumentError("--max-waiting must be >= 0");
  if (c.max_waiting_tokens < 0) {
    return absl::InvalidArgumentError("--max-waiting-tokens must be >= 0");
  }
  if (c.step_tokens < 1) return absl::InvalidArgumentError("--step-tokens must be >= 1");
  return o;
}

// Says where the server listens: on stderr, and in --port-file (the gRPC
// port, then the metrics port) for scripts that asked for port 0.
absl::Status Announce(const Flags& flags, const Server& server, const std::string& what) {
  std::fprintf(stderr, "deltaserve %s: listening on port %d", what.c_str(), server.port());
  if (server.metrics_port() >= 0) {
    std::fprintf(stderr, ", metrics on http://...:%d/metrics", server.metrics_port());
  }
  std::fprintf(stderr, "\n");
  if (!flags.Has("port-file")) return absl::OkStatus();
  const std::string text = absl::StrCat(server.port(), "\n", server.metrics_port(), "\n");
  return WriteFileAtomically(flags.GetString("port-file"), [&](std::ostream& out) { out << text; });
}

}  // namespace

const CommandSpec& ServeSpec() {
  static const auto* spec = new CommandSpec{
      .name = "serve",
      .summary = "the gRPC API and a one-process worker (Ctrl-C stops it)",
      .usage = "--model DIR [flags]",
      .flags = Concat(ServerFlags("127.0.0.1"),
                      {{"threads", "N", "compute threads (0: OpenMP's default)", "0"}}),
      .examples = {"deltaserve serve --model /tmp/k3-tiny --port 50051 --metrics-port 9090"},
      .details = "For --pp/--tp or mpirun, run `deltaserve coordinator` and `deltaserve worker`.",
  };
  return *spec;
}

const CommandSpec& CoordinatorSpec() {
  static const auto* spec = new CommandSpec{
      .name = "coordinator",
      .summary = "the gRPC API; MPI `deltaserve worker` jobs attach to it and run the model",
      .usage = "--model DIR [flags]",
      .flags = ServerFlags("0.0.0.0"),
      .examples = {"deltaserve coordinator --model DIR --port 50051 --metrics-port 9090",
                   "mpirun -np 4 deltaserve worker --coordinator HOST:50051 --model DIR "
                   "--pp 2 --tp 2"},
  };
  return *spec;
}

const CommandSpec& WorkerSpec() {
  static const auto* spec = new CommandSpec{
      .name = "worker",
      .summary = "one replica of the model as an MPI job, attached to a coordinator",
      .usage = "--coordinator HOST:PORT --model DIR [--pp N --tp M] [flags]",
      .flags = Concat(DeploymentFlags(),
                      {
                          {"coordinator", "HOST:PORT", "the coordinator to attach to"},
                          {"connect-timeout", "S", "seconds to wait for the coordinator", "60"},
                          {"plan-context", "T", "context the stage split is balanced for", "32768"},
                      }),
      .examples =
          {"deltaserve worker --coordinator HOST:50051 --model DIR",
           "mpirun -np 4 deltaserve worker --coordinator HOST:50051 --model DIR --pp 2 --tp 2"},
      .details =
          "One rank per process: mpirun -np pp*tp deltaserve worker ...; rank 0 holds the "
          "link to the coordinator.",
  };
  return *spec;
}

absl::Status RunServe(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(ServeSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(ServerOptions options, ServerOptionsFrom(flags, "127.0.0.1"));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 0));
  const sigset_t signals = BlockStopSignals();
  // The one-rank worker: the whole model in this process.
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
  DELTASERVE_ASSIGN_OR_RETURN(Deployment deployment, Deploy(flags, config, 0));
  if (deployment.distributed) {
    return absl::InvalidArgumentError(
        "serve runs in one process; for --pp/--tp or mpirun use `deltaserve coordinator` and "
        "`deltaserve worker`");
  }
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(options));
  LocalWorker worker(*deployment.replica, server->coordinator(), static_cast<int>(threads));
  DELTASERVE_RETURN_IF_ERROR(worker.Attach(config, "embedded worker (this process)"));
  // From here the coordinator may run steps on `worker`: shut the server down
  // before the worker goes out of scope, on every path.
  if (absl::Status status = Announce(flags, *server, "serve"); !status.ok()) {
    server->Shutdown();
    return status;
  }
  const int signal = WaitForSignal(signals);
  std::fprintf(stderr, "deltaserve serve: %s, shutting down\n", strsignal(signal));
  server->Shutdown();
  return absl::OkStatus();
}

absl::Status RunCoordinator(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(CoordinatorSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(ServerOptions options, ServerOptionsFrom(flags, "0.0.0.0"));
  const sigset_t signals = BlockStopSignals();
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(options));
  DELTASERVE_RETURN_IF_ERROR(Announce(flags, *server, "coordinator"));
  const int signal = WaitForSignal(signals);
  std::fprintf(stderr, "deltaserve coordinator: %s, shutting down\n", strsignal(signal));
  server->Shutdown();
  return absl::OkStatus();
}

absl::Status RunWorkerCommand(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(WorkerSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(std::string coordinator, flags.Required("coordinator"));
  DELTASERVE_ASSIGN_OR_RETURN(double connect_timeout, flags.GetDouble("connect-timeout", 60));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t plan_context, flags.GetInt("plan-context", 32768));
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
  DELTASERVE_ASSIGN_OR_RETURN(Deployment deployment, Deploy(flags, config, plan_context));
  Communicator& world = *deployment.world;
  Replica& replica = *deployment.replica;
  WorkerOptions options;
  options.description = absl::StrCat(deployment.description, " of ", world.size(), " ranks (pp ",
                                     deployment.layout.pp, ", tp ", deployment.layout.tp, ")");
  options.connect_timeout_s = connect_timeout;
  if (replica.is_leader()) {
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxReceiveMessageSize(-1);
    channel_args.SetMaxSendMessageSize(-1);
    channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    channel_args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    options.channel =
        grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), channel_args);
    std::fprintf(stderr, "deltaserve worker: %s, attaching to %s\n", options.description.c_str(),
                 coordinator.c_str());
  }
  return RunWorker(replica, config, options);
}

}  // namespace deltaserve
