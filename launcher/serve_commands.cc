// serve, coordinator and worker: the serving processes.
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/threads.h"
#include "launcher/channel_flags.h"
#include "launcher/commands.h"
#include "launcher/deployment.h"
#include "launcher/flags.h"
#include "runtime/common/file_util.h"
#include "runtime/common/log.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/local_worker.h"
#include "runtime/serving/server.h"
#include "runtime/serving/worker.h"
#include "runtime/serving/worker_token.h"

namespace deltaserve {
namespace {

// Limits on what one request may cost (docs/security.md, Limits).
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
      {"max-prompt-tokens", "N",
       "a request's prompt tokens, a conversation's as its chat template renders them "
       "(0: the model's context)",
       "0"},
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
  DELTASERVE_ASSIGN_OR_RETURN(l.max_prompt_tokens,
                              flags.GetInt("max-prompt-tokens", l.max_prompt_tokens));
  auto at_least = [](int64_t value, int64_t min, const char* flag) {
    return value >= min ? absl::OkStatus()
                        : absl::InvalidArgumentError(absl::StrCat("--", flag, " must be >= ", min));
  };
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_request_bytes, 1, "max-request-bytes"));
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_text_bytes_per_token, 1, "max-text-bytes-per-token"));
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_stop_token_ids, 0, "max-stop-token-ids"));
  DELTASERVE_RETURN_IF_ERROR(at_least(l.max_prompt_tokens, 0, "max-prompt-tokens"));
  DELTASERVE_RETURN_IF_ERROR(
      at_least(l.max_concurrent_tokenizations, 1, "max-concurrent-tokenizations"));
  if (!(l.client_write_timeout_s > 0 && l.client_write_timeout_s <= 86400)) {
    return absl::InvalidArgumentError("--client-write-timeout must be in (0, 86400] seconds");
  }
  return l;
}

constexpr int kDefaultWorkerPort = 50052;
constexpr double kDefaultDrainTimeoutS = 30;

FlagSpec LogFormatFlag() {
  return {"log-format", "F",
          "log lines on stderr as text (time, level, part: message and key=value fields) or "
          "json (an object per line), docs/deployment.md \"Logs\"",
          "text"};
}

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
      {"step-timeout", "S",
       "seconds a remote worker may take to answer a step or read a write before it is dropped "
       "(its requests run elsewhere)",
       absl::StrCat(c.step_timeout_s)},
      {"step-timeout-floor", "S",
       "once a worker's cost model has learned its steps, a step may take 10 times what the model "
       "expects or its recent steps took, but at least S seconds (and at most --step-timeout)",
       absl::StrCat(c.step_timeout_floor_s)},
      {"step-log", "F",
       "write a JSON line per step to F (worker, prefill chunks and their prefixes, decode rows, "
       "wall and per-stage compute seconds)"},
      {"drain-timeout", "S",
       "on SIGTERM: seconds running and queued requests may take to finish before the rest end "
       "with UNAVAILABLE",
       absl::StrCat(kDefaultDrainTimeoutS)},
      LogFormatFlag(),
  };
  if (worker_port) {
    flags.push_back({"worker-port", "N",
                     "the port workers attach to (0: any free one, see --port-file)",
                     absl::StrCat(kDefaultWorkerPort)});
  }
  flags = Concat(
      flags,
      {
          {"http-port", "N",
           "serve the OpenAI HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
           "/health) on this port of --host, with the client port's TLS and tokens (-1: none; "
           "0: any free one, see --port-file)",
           "-1"},
          {"served-model-name", "NAME",
           "the model's name in the HTTP API (/v1/models, requests' `model`); default: the "
           "model directory's name"},
          {"http-max-connections", "N",
           "HTTP connections open at once; connections that wait for a request give way to new "
           "ones (docs/security.md), and when none does a new connection gets 503",
           absl::StrCat(o.http_max_connections)},
          {"metrics-host", "ADDR", "the address /metrics listens on", o.metrics_host},
          {"metrics-port", "N", "serve Prometheus /metrics on this port (-1: none; 0: any free)",
           "-1"},
          {"port-file", "F",
           "once listening, write to F the client port, the metrics port, the worker port and "
           "the HTTP port, a line each (-1: none); a worker token the coordinator made goes to "
           "F.worker-token"},
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
                               "workers must send one of these bearer tokens (mode 600); "
                               "without it or --tls-worker-ca the coordinator makes a token "
                               "(docs/security.md)"},
                              {"insecure-workers", "",
                               "let workers attach with no credentials (any local process could "
                               "attach and read every prompt)"},
                          });
  }
  flags = Concat(
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
          {"prefix-cache-bytes", "N",
           "state each worker's prefix cache may hold on a rank, for prompts that begin alike "
           "(0: no cache)",
           absl::StrCat(c.prefix_cache_bytes)},
          {"prefix-cache-principal-bytes", "N",
           "of that, what one principal's entries may hold (default: a quarter; 0: all)"},
          {"prefix-cache-shared", "",
           "principals start from each other's cached prefixes too (by default each only from "
           "its own: a hit would tell another what was sent; docs/security.md)"},
          {"progress-interval", "S",
           "seconds between the prefill progress messages of a request's stream (0: none)",
           absl::StrCat(c.progress_interval_s)},
      });
  return Concat(flags, LimitFlags());
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

// The coordinator's answer to SIGTERM or SIGINT: health NOT_SERVING and no
// new requests at once, up to --drain-timeout for the admitted ones (a
// second signal cuts that short), then the rest end with UNAVAILABLE and the
// server stops.
void DrainAndStop(Server& server, const sigset_t& signals, int signal, double drain_timeout_s,
                  const std::string& what) {
  log::Info(what,
            absl::StrCat(strsignal(signal), ", shutting down: draining first (up to ",
                         drain_timeout_s, " s, --drain-timeout; signal again to stop at once)"));
  std::atomic<bool> drained{false};
  Coordinator& coordinator = server.coordinator();
  std::thread second([&] {
    const int again = WaitForSignal(signals);
    if (drained) return;  // the wake-up below
    log::Info(what, absl::StrCat(strsignal(again), " again, ending the drain"));
    coordinator.CutDrain();
  });
  const int64_t left = server.Drain(std::chrono::duration<double>(drain_timeout_s));
  drained = true;
  pthread_kill(second.native_handle(), SIGTERM);  // taken by its sigwait: signals are blocked
  second.join();
  if (left > 0) {
    log::Warning(what, absl::StrCat(left, " requests did not finish in time: ending them"));
  }
  server.Shutdown();
  log::Info(what, "stopped");
}

absl::StatusOr<double> DrainTimeout(const Flags& flags) {
  DELTASERVE_ASSIGN_OR_RETURN(double s, flags.GetDouble("drain-timeout", kDefaultDrainTimeoutS));
  if (!(s >= 0) || s > 1e6) {
    return absl::InvalidArgumentError("--drain-timeout must be in [0, 1e6] seconds");
  }
  return s;
}

// --log-format: how every log line after it is written (runtime/common/log.h).
absl::Status SetLogFormat(const Flags& flags) {
  absl::StatusOr<log::Format> format = log::ParseFormat(flags.GetString("log-format", "text"));
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-format: ", format.status().message()));
  }
  log::SetFormat(*format);
  return absl::OkStatus();
}

// The last component of a directory's path: "k3-tiny" for "/models/k3-tiny/".
std::string DirectoryName(const std::string& dir) {
  std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  return path.filename().string();
}

// `worker_port`: the coordinator's; serve has its worker in-process.
absl::StatusOr<ServerOptions> ServerOptionsFrom(const Flags& flags, bool worker_port) {
  ServerOptions o;
  DELTASERVE_ASSIGN_OR_RETURN(o.model_dir, flags.Required("model"));
  o.host = flags.GetString("host", o.host);
  o.metrics_host = flags.GetString("metrics-host", o.metrics_host);
  DELTASERVE_ASSIGN_OR_RETURN(o.port, PortFlag(flags, "port", o.port, false));
  DELTASERVE_ASSIGN_OR_RETURN(o.metrics_port, PortFlag(flags, "metrics-port", -1, true));
  DELTASERVE_ASSIGN_OR_RETURN(o.http_port, PortFlag(flags, "http-port", -1, true));
  o.model_name = flags.GetString("served-model-name", DirectoryName(o.model_dir));
  if (o.model_name.empty() || o.model_name.size() > 256) {
    return absl::InvalidArgumentError("--served-model-name: 1 to 256 bytes");
  }
  DELTASERVE_ASSIGN_OR_RETURN(int64_t http_connections,
                              flags.GetInt("http-max-connections", o.http_max_connections));
  if (http_connections < 1 || http_connections > 65536) {
    return absl::InvalidArgumentError("--http-max-connections must be in [1, 65536]");
  }
  o.http_max_connections = static_cast<int>(http_connections);
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
  DELTASERVE_ASSIGN_OR_RETURN(c.prefix_cache_bytes,
                              flags.GetInt("prefix-cache-bytes", c.prefix_cache_bytes));
  if (c.prefix_cache_bytes < 0) {
    return absl::InvalidArgumentError("--prefix-cache-bytes must be >= 0");
  }
  c.prefix_cache_principal_bytes = c.prefix_cache_bytes / 4;
  DELTASERVE_ASSIGN_OR_RETURN(
      c.prefix_cache_principal_bytes,
      flags.GetInt("prefix-cache-principal-bytes", c.prefix_cache_principal_bytes));
  if (c.prefix_cache_principal_bytes < 0) {
    return absl::InvalidArgumentError("--prefix-cache-principal-bytes must be >= 0");
  }
  c.prefix_cache_shared = flags.Has("prefix-cache-shared");
  DELTASERVE_ASSIGN_OR_RETURN(c.step_timeout_s, flags.GetDouble("step-timeout", c.step_timeout_s));
  if (!(c.step_timeout_s > 0) || c.step_timeout_s > 1e6) {
    return absl::InvalidArgumentError("--step-timeout must be in (0, 1e6] seconds");
  }
  DELTASERVE_ASSIGN_OR_RETURN(c.step_timeout_floor_s,
                              flags.GetDouble("step-timeout-floor", c.step_timeout_floor_s));
  if (!(c.step_timeout_floor_s > 0) || c.step_timeout_floor_s > 1e6) {
    return absl::InvalidArgumentError("--step-timeout-floor must be in (0, 1e6] seconds");
  }
  if (flags.Has("step-log")) {
    const std::string path = flags.GetString("step-log");
    absl::StatusOr<std::unique_ptr<std::ostream>> log = OpenOutputStream(path);
    if (!log.ok()) {
      return absl::Status(log.status().code(),
                          absl::StrCat("--step-log: ", log.status().message()));
    }
    c.step_log = std::shared_ptr<std::ostream>(std::move(*log));
  }
  DELTASERVE_ASSIGN_OR_RETURN(c.progress_interval_s,
                              flags.GetDouble("progress-interval", c.progress_interval_s));
  if (!(c.progress_interval_s >= 0) || c.progress_interval_s > 86400) {
    return absl::InvalidArgumentError("--progress-interval must be in [0, 86400] seconds");
  }
  DELTASERVE_ASSIGN_OR_RETURN(o.limits, LimitsFrom(flags));
  if (c.max_running < 1) return absl::InvalidArgumentError("--max-running must be >= 1");
  if (c.max_waiting < 0) return absl::InvalidArgumentError("--max-waiting must be >= 0");
  if (c.max_waiting_tokens < 0) {
    return absl::InvalidArgumentError("--max-waiting-tokens must be >= 0");
  }
  if (c.step_tokens < 1) return absl::InvalidArgumentError("--step-tokens must be >= 1");
  // Checked here too, so that a bad value fails at start rather than at SIGTERM.
  DELTASERVE_RETURN_IF_ERROR(DrainTimeout(flags).status());
  return o;
}

// Says where the server listens: on stderr, and in --port-file (the client
// port, the metrics port, the worker port, the HTTP port, -1 for none) for
// scripts that asked for port 0.
absl::Status Announce(const Flags& flags, const Server& server, const std::string& what) {
  std::string message = absl::StrCat("listening on port ", server.port());
  if (server.worker_port() >= 0) {
    absl::StrAppend(&message, ", workers attach on port ", server.worker_port());
  }
  if (server.metrics_port() >= 0) {
    // The address a scraper uses: --metrics-host, an IPv6 one in brackets.
    const std::string host = flags.GetString("metrics-host", ServerOptions().metrics_host);
    const std::string url_host = host.find(':') == std::string::npos ? host : "[" + host + "]";
    absl::StrAppend(&message, ", metrics on http://", url_host, ":", server.metrics_port(),
                    "/metrics");
  }
  if (server.http_port() >= 0) {
    absl::StrAppend(&message, ", the HTTP API on port ", server.http_port());
  }
  log::Info(what, message,
            {{"port", server.port()},
             {"worker_port", server.worker_port()},
             {"metrics_port", server.metrics_port()},
             {"http_port", server.http_port()}});
  if (!flags.Has("port-file")) return absl::OkStatus();
  const std::string text = absl::StrCat(server.port(), "\n", server.metrics_port(), "\n",
                                        server.worker_port(), "\n", server.http_port(), "\n");
  return WriteFileAtomically(flags.GetString("port-file"), [&](std::ostream& out) { out << text; });
}

// A coordinator given no worker credentials makes a worker token (unless
// --insecure-workers) and writes it, mode 600, where its workers find it:
// beside --port-file (`<port-file>.worker-token`, for scripts and for workers
// on other hosts of a shared file system), and at DefaultWorkerTokenPath of
// its worker port, where `deltaserve worker` of this user on this host looks
// by itself. Returns the files written.
absl::StatusOr<std::vector<std::string>> WriteWorkerToken(const Flags& flags, const Server& server,
                                                          const std::string& token) {
  struct Place {
    std::string path;
    bool make_dir;  // the default path's folder may not exist yet
  };
  std::vector<Place> places;
  std::vector<std::string> written;
  std::vector<std::string> failed;
  if (flags.Has("port-file")) {
    places.push_back({flags.GetString("port-file") + ".worker-token", false});
  }
  const std::string default_path = DefaultWorkerTokenPath(server.worker_port());
  if (!default_path.empty()) places.push_back({default_path, true});
  for (const Place& place : places) {
    if (absl::Status s = WriteWorkerTokenFile(place.path, token, place.make_dir); s.ok()) {
      written.push_back(place.path);
    } else {
      failed.emplace_back(s.message());
    }
  }
  if (default_path.empty()) failed.emplace_back("neither XDG_RUNTIME_DIR nor HOME is set");
  for (const std::string& f : failed) {
    log::Warning("coordinator", absl::StrCat("worker token not written: ", f));
  }
  if (written.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no worker credentials were given and the worker token this coordinator made could not "
        "be written anywhere (",
        absl::StrJoin(failed, "; "),
        "): give --worker-token-file or --tls-worker-ca, or --insecure-workers"));
  }
  log::Info("coordinator",
            absl::StrCat("workers must send the worker token in ", absl::StrJoin(written, " and "),
                         " (made for this run, mode 600): `deltaserve worker` of this user on "
                         "this host reads it by itself; elsewhere give it --worker-token-file"));
  return written;
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
      .details =
          "For --pp/--tp or mpirun, run `deltaserve coordinator` and `deltaserve worker`. "
          "SIGTERM or SIGINT drains: no new requests, up to --drain-timeout for the "
          "admitted ones, then exit 0.",
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
          "secure both. "
          "SIGTERM or SIGINT drains: health NOT_SERVING and no new requests at once, up to "
          "--drain-timeout for the admitted ones, then the rest end with UNAVAILABLE and "
          "the coordinator exits 0.",
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
                          {"keepalive", "S",
                           "ping the coordinator after S seconds without traffic; no answer "
                           "within S/2 ends the link (1..3600)",
                           "10"},
                          {"plan-context", "T", "context the stage split is balanced for", "32768"},
                          LogFormatFlag(),
                          {"stats", "",
                           "on exit, print each rank's weight bytes, peak resident memory, "
                           "bytes sent to the next stage and compute time"},
                      }),
      .examples =
          {"deltaserve worker --coordinator HOST:50052 --model DIR",
           "mpirun -np 4 deltaserve worker --coordinator HOST:50052 --model DIR --pp 2 --tp 2 "
           "--tls-ca ca.pem --worker-token-file workers"},
      .details =
          "One rank per process: mpirun -np pp*tp deltaserve worker ...; rank 0 holds the "
          "link to the coordinator. SIGTERM or SIGINT (to mpirun, or to every rank): the worker "
          "answers the steps it has started, tells the coordinator, which runs its requests "
          "elsewhere, and exits 0.",
  };
  return *spec;
}

absl::Status RunServe(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(ServeSpec(), args));
  DELTASERVE_RETURN_IF_ERROR(SetLogFormat(flags));
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
  DELTASERVE_ASSIGN_OR_RETURN(const double drain_timeout, DrainTimeout(flags));
  DrainAndStop(*server, signals, WaitForSignal(signals), drain_timeout, "serve");
  return absl::OkStatus();
}

absl::Status RunCoordinator(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(CoordinatorSpec(), args));
  DELTASERVE_RETURN_IF_ERROR(SetLogFormat(flags));
  DELTASERVE_ASSIGN_OR_RETURN(ServerOptions options, ServerOptionsFrom(flags, true));
  const bool credentials = !options.worker_ca_file.empty() || !options.worker_tokens_file.empty();
  if (flags.Has("insecure-workers") && credentials) {
    return absl::InvalidArgumentError(
        "--insecure-workers lets workers attach without credentials: it cannot go with "
        "--worker-token-file or --tls-worker-ca");
  }
  // Safe by default: with no worker credentials, a token of its own.
  if (!credentials && !flags.Has("insecure-workers")) {
    DELTASERVE_ASSIGN_OR_RETURN(options.worker_token, NewWorkerToken());
  }
  const sigset_t signals = BlockStopSignals();
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(options));
  std::vector<std::string> token_files;
  if (!options.worker_token.empty()) {
    // Before the port file, so that whoever waits for it finds the token.
    absl::StatusOr<std::vector<std::string>> written =
        WriteWorkerToken(flags, *server, options.worker_token);
    if (!written.ok()) {
      server->Shutdown();
      return written.status();
    }
    token_files = std::move(*written);
  }
  if (absl::Status announced = Announce(flags, *server, "coordinator"); !announced.ok()) {
    server->Shutdown();
    for (const std::string& f : token_files) RemoveWorkerTokenFile(f, options.worker_token);
    return announced;
  }
  DELTASERVE_ASSIGN_OR_RETURN(const double drain_timeout, DrainTimeout(flags));
  DrainAndStop(*server, signals, WaitForSignal(signals), drain_timeout, "coordinator");
  for (const std::string& f : token_files) RemoveWorkerTokenFile(f, options.worker_token);
  return absl::OkStatus();
}

absl::Status RunWorkerCommand(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(WorkerSpec(), args));
  DELTASERVE_RETURN_IF_ERROR(SetLogFormat(flags));
  DELTASERVE_ASSIGN_OR_RETURN(std::string coordinator, flags.Required("coordinator"));
  DELTASERVE_ASSIGN_OR_RETURN(double connect_timeout, flags.GetDouble("connect-timeout", 60));
  DELTASERVE_ASSIGN_OR_RETURN(double keepalive, flags.GetDouble("keepalive", 10));
  if (!(keepalive >= 1 && keepalive <= 3600)) {
    return absl::InvalidArgumentError("--keepalive must be in [1, 3600] seconds");
  }
  DELTASERVE_ASSIGN_OR_RETURN(int64_t plan_context, flags.GetInt("plan-context", 32768));
  // SIGTERM and SIGINT (mpirun forwards them to every rank) ask the worker to
  // leave: the leader answers the steps it has started, tells the coordinator
  // and detaches; the other ranks end when the leader stops them. Blocked
  // before MPI starts its threads, so that this waiter is where they arrive.
  const sigset_t signals = BlockStopSignals();
  static LeaveSignal leave;  // outlives the waiter, which is never joined
  std::thread([signals] {
    const int signal = WaitForSignal(signals);
    log::Info("worker", absl::StrCat(strsignal(signal), ", leaving after the current step"));
    leave.Request(absl::StrCat("the worker got ", strsignal(signal)));
  }).detach();
  DELTASERVE_ASSIGN_OR_RETURN(ModelConfig config, DeploymentConfig(flags));
  DELTASERVE_ASSIGN_OR_RETURN(Deployment deployment, Deploy(flags, config, plan_context));
  Communicator& world = *deployment.comms.control;
  Replica& replica = *deployment.replica;
  WorkerOptions options;
  options.description = absl::StrCat(
      deployment.description, " of ", world.size(), " ranks (pp ", deployment.layout.pp, ", tp ",
      deployment.layout.tp, "), ", kernels::NumThreads(),
      kernels::NumThreads() == 1 ? " thread" : " threads", " a rank");
  options.connect_timeout_s = connect_timeout;
  options.leave = &leave;
  if (replica.is_leader()) {
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxReceiveMessageSize(-1);
    channel_args.SetMaxSendMessageSize(-1);
    channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(keepalive * 1000));
    channel_args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(keepalive * 500));
    channel_args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    ChannelSecurity security = ChannelSecurityFrom(flags, "worker-token-file");
    // The token a coordinator of this user on this host made for itself.
    if (security.token_file.empty()) {
      if (std::optional<int> port = TargetPort(coordinator)) {
        const std::string path = DefaultWorkerTokenPath(*port);
        if (!path.empty() && ::access(path.c_str(), F_OK) == 0) {
          log::Info("worker", absl::StrCat("using the coordinator's worker token in ", path));
          security.token_file = path;
        }
      }
    }
    options.target = coordinator;
    options.tls = security.tls();
    auto channel = OpenChannel(coordinator, security, channel_args);
    if (!channel.ok()) {
      (void)replica.Stop();  // the other ranks follow this one: release them
      return channel.status();
    }
    options.channel = std::move(*channel);
    log::Info("worker", absl::StrCat(options.description, ", attaching to ", coordinator));
  }
  absl::Status status = RunWorker(replica, config, options);
  if (flags.Has("stats")) PrintPipelineStats(deployment);
  return status;
}

}  // namespace deltaserve
