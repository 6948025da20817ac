// serve, coordinator and worker: the serving processes.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "launcher/channel_flags.h"
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

constexpr int kDefaultWorkerPort = 50052;

// The flags of serve and coordinator; the coordinator has a worker port.
std::vector<FlagSpec> ServerFlags(bool worker_port) {
  const ServerOptions o;
  const CoordinatorOptions& c = o.coordinator;
  std::vector<FlagSpec> flags = {
      {"model", "DIR", "the model directory (config.json, tokenizer files)"},
      {"host", "ADDR",
       "the address the gRPC ports listen on; another than loopback needs TLS or tokens "
       "(docs/security.md) or --insecure",
       o.host},
      {"port", "N", "the client gRPC port (0: any free one, see --port-file)",
       absl::StrCat(o.port)},
  };
  if (worker_port) {
    flags.push_back({"worker-port", "N",
                     "the port workers attach to (0: any free one, see --port-file)",
                     absl::StrCat(kDefaultWorkerPort)});
  }
  flags = Concat(
      flags,
      {
          {"metrics-host", "ADDR", "the address /metrics listens on", o.metrics_host},
          {"metrics-port", "N", "serve Prometheus /metrics on this port (-1: none; 0: any free)",
           "-1"},
          {"port-file", "F",
           "once listening, write to F the client port, the metrics port and the worker port, "
           "a line each (-1: none)"},
          {"tls-cert", "F", "serve TLS with this certificate chain (PEM) on every gRPC port"},
          {"tls-key", "F", "its private key (PEM, mode 600)"},
          {"tls-client-ca", "F",
           "mutual TLS on the client port: clients need a certificate this "
           "CA signed"},
          {"client-tokens-file", "F",
           "clients must send one of these bearer tokens (mode 600; `principal:token` lines)"},
      });
  if (worker_port) {
    flags = Concat(flags, {
                              {"tls-worker-ca", "F",
                               "mutual TLS on the worker port: workers need a certificate this "
                               "CA signed"},
                              {"worker-token-file", "F",
                               "workers must send one of these bearer tokens (mode 600)"},
                          });
  }
  return Concat(
      flags,
      {
          {"insecure", "", "allow a non-loopback --host with no TLS and no tokens"},
          {"max-connection-streams", "N", "HTTP/2 streams one connection may have open",
           absl::StrCat(o.max_connection_streams)},
          {"max-metadata-bytes", "N", "HTTP/2 header list (metadata) of one call at most",
           absl::StrCat(o.max_metadata_bytes)},
          {"grpc-memory-bytes", "N", "memory gRPC may hold for all connections",
           absl::StrCat(o.grpc_memory_bytes)},
          {"max-running", "N", "sequences holding state per worker", absl::StrCat(c.max_running)},
          {"max-waiting", "N", "requests queued behind them (then RESOURCE_EXHAUSTED)",
           absl::StrCat(c.max_waiting)},
          {"max-waiting-tokens", "N", "prompt tokens queued", absl::StrCat(c.max_waiting_tokens)},
          {"step-tokens", "N", "token budget of one step", absl::StrCat(c.step_tokens)},
          {"max-request-bytes", "N", "a request's text or token ids at most",
           absl::StrCat(o.max_request_bytes)},
      });
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

absl::StatusOr<int> PortFlag(const Flags& flags, const std::string& name, int64_t fallback,
                             bool none_allowed) {
  DELTASERVE_ASSIGN_OR_RETURN(int64_t port, flags.GetInt(name, fallback));
  if (port < (none_allowed ? -1 : 0) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be in [0, 65535]", none_allowed ? " (or -1: none)" : ""));
  }
  return static_cast<int>(port);
}

// `worker_port`: the coordinator's; serve has its worker in-process.
absl::StatusOr<ServerOptions> ServerOptionsFrom(const Flags& flags, bool worker_port) {
  ServerOptions o;
  DELTASERVE_ASSIGN_OR_RETURN(o.model_dir, flags.Required("model"));
  o.host = flags.GetString("host", o.host);
  o.metrics_host = flags.GetString("metrics-host", o.metrics_host);
  DELTASERVE_ASSIGN_OR_RETURN(o.port, PortFlag(flags, "port", o.port, false));
  DELTASERVE_ASSIGN_OR_RETURN(o.metrics_port, PortFlag(flags, "metrics-port", -1, true));
  if (worker_port) {
    DELTASERVE_ASSIGN_OR_RETURN(o.worker_port,
                                PortFlag(flags, "worker-port", kDefaultWorkerPort, false));
    o.worker_ca_file = flags.GetString("tls-worker-ca");
    o.worker_tokens_file = flags.GetString("worker-token-file");
  }
  o.tls.cert_file = flags.GetString("tls-cert");
  o.tls.key_file = flags.GetString("tls-key");
  o.tls.client_ca_file = flags.GetString("tls-client-ca");
  o.client_tokens_file = flags.GetString("client-tokens-file");
  o.insecure = flags.Has("insecure");
  DELTASERVE_ASSIGN_OR_RETURN(int64_t streams,
                              flags.GetInt("max-connection-streams", o.max_connection_streams));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t metadata,
                              flags.GetInt("max-metadata-bytes", o.max_metadata_bytes));
  DELTASERVE_ASSIGN_OR_RETURN(o.grpc_memory_bytes,
                              flags.GetInt("grpc-memory-bytes", o.grpc_memory_bytes));
  if (streams < 1 || streams > INT32_MAX) {
    return absl::InvalidArgumentError("--max-connection-streams must be in [1, 2^31)");
  }
  if (metadata < 1024 || metadata > (16 << 20)) {
    return absl::InvalidArgumentError("--max-metadata-bytes must be in [1024, 16 MiB]");
  }
  if (o.grpc_memory_bytes < (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("--grpc-memory-bytes must be >= 64 MiB");
  }
  o.max_connection_streams = static_cast<int>(streams);
  o.max_metadata_bytes = static_cast<int>(metadata);
  CoordinatorOptions& c = o.coordinator;
  DELTASERVE_ASSIGN_OR_RETURN(c.max_running, flags.GetInt("max-running", c.max_running));
  DELTASERVE_ASSIGN_OR_RETURN(c.max_waiting, flags.GetInt("max-waiting", c.max_waiting));
  DELTASERVE_ASSIGN_OR_RETURN(c.max_waiting_tokens,
                              flags.GetInt("max-waiting-tokens", c.max_waiting_tokens));
  DELTASERVE_ASSIGN_OR_RETURN(c.step_tokens, flags.GetInt("step-tokens", c.step_tokens));
  DELTASERVE_ASSIGN_OR_RETURN(o.max_request_bytes,
                              flags.GetInt("max-request-bytes", o.max_request_bytes));
  if (c.max_running < 1) return absl::InvalidArgumentError("--max-running must be >= 1");
  if (c.max_waiting < 0) return absl::InvalidArgumentError("--max-waiting must be >= 0");
  if (c.max_waiting_tokens < 0) {
    return absl::InvalidArgumentError("--max-waiting-tokens must be >= 0");
  }
  if (c.step_tokens < 1) return absl::InvalidArgumentError("--step-tokens must be >= 1");
  if (o.max_request_bytes < 1) {
    return absl::InvalidArgumentError("--max-request-bytes must be >= 1");
  }
  return o;
}

// Says where the server listens: on stderr, and in --port-file (the client
// port, the metrics port, the worker port, -1 for none) for scripts that
// asked for port 0.
absl::Status Announce(const Flags& flags, const Server& server, const std::string& what) {
  std::fprintf(stderr, "deltaserve %s: listening on port %d", what.c_str(), server.port());
  if (server.worker_port() >= 0) {
    std::fprintf(stderr, ", workers attach on port %d", server.worker_port());
  }
  if (server.metrics_port() >= 0) {
    std::fprintf(stderr, ", metrics on http://...:%d/metrics", server.metrics_port());
  }
  std::fprintf(stderr, "\n");
  if (!flags.Has("port-file")) return absl::OkStatus();
  const std::string text =
      absl::StrCat(server.port(), "\n", server.metrics_port(), "\n", server.worker_port(), "\n");
  return WriteFileAtomically(flags.GetString("port-file"), [&](std::ostream& out) { out << text; });
}

}  // namespace

const CommandSpec& ServeSpec() {
  static const auto* spec = new CommandSpec{
      .name = "serve",
      .summary = "the gRPC API and a one-process worker (Ctrl-C stops it)",
      .usage = "--model DIR [flags]",
      .flags = Concat(ServerFlags(false),
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
      .flags = ServerFlags(true),
      .examples = {"deltaserve coordinator --model DIR --port 50051 --worker-port 50052",
                   "deltaserve coordinator --model DIR --host 10.0.0.5 --tls-cert cert.pem "
                   "--tls-key key.pem --client-tokens-file clients --worker-token-file workers",
                   "mpirun -np 4 deltaserve worker --coordinator HOST:50052 --model DIR "
                   "--pp 2 --tp 2"},
      .details =
          "Clients use the client port (Generation, health, reflection); workers attach "
          "on the worker port, which serves nothing else. docs/security.md says how to "
          "secure both.",
  };
  return *spec;
}

const CommandSpec& WorkerSpec() {
  static const auto* spec = new CommandSpec{
      .name = "worker",
      .summary = "one replica of the model as an MPI job, attached to a coordinator",
      .usage = "--coordinator HOST:PORT --model DIR [--pp N --tp M] [flags]",
      .flags = Concat(Concat(DeploymentFlags(), ChannelSecurityFlags("worker-token-file")),
                      {
                          {"coordinator", "HOST:PORT",
                           "the coordinator's worker port (its --worker-port) to attach to"},
                          {"connect-timeout", "S", "seconds to wait for the coordinator", "60"},
                          {"plan-context", "T", "context the stage split is balanced for", "32768"},
                      }),
      .examples =
          {"deltaserve worker --coordinator HOST:50052 --model DIR",
           "mpirun -np 4 deltaserve worker --coordinator HOST:50052 --model DIR --pp 2 --tp 2 "
           "--tls-ca ca.pem --worker-token-file workers"},
      .details =
          "One rank per process: mpirun -np pp*tp deltaserve worker ...; rank 0 holds the "
          "link to the coordinator.",
  };
  return *spec;
}

absl::Status RunServe(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(ServeSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(ServerOptions options, ServerOptionsFrom(flags, false));
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
  DELTASERVE_ASSIGN_OR_RETURN(ServerOptions options, ServerOptionsFrom(flags, true));
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
    auto channel =
        OpenChannel(coordinator, ChannelSecurityFrom(flags, "worker-token-file"), channel_args);
    if (!channel.ok()) {
      (void)replica.Stop();  // the other ranks follow this one: release them
      return channel.status();
    }
    options.channel = std::move(*channel);
    std::fprintf(stderr, "deltaserve worker: %s, attaching to %s\n", options.description.c_str(),
                 coordinator.c_str());
  }
  return RunWorker(replica, config, options);
}

}  // namespace deltaserve
