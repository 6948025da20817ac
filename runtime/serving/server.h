// The gRPC servers of `deltaserve coordinator` and `deltaserve serve`: on the
// client port the Generation API, grpc.health.v1.Health (SERVING only while a
// worker is attached) and server reflection; on the worker port (the
// coordinator's; serve's worker is in its process) the WorkerLink workers
// attach to, and nothing else; the OpenAI HTTP API (http_api.h); Prometheus
// metrics over HTTP. Each listener
// can do TLS and authenticate its callers (runtime/serving/auth.h);
// docs/security.md says how.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/serving/coordinator.h"
#include "runtime/serving/credentials.h"
#include "runtime/serving/request_validation.h"

namespace deltaserve {

struct ServerOptions {
  // Both gRPC listeners bind `host`. Another address than loopback needs
  // every listener to authenticate (TLS or tokens for clients; a worker CA or
  // token for workers) unless `insecure`.
  std::string host = "127.0.0.1";
  int port = 50051;      // the client port; 0: any free port (see Server::port)
  int worker_port = -1;  // -1: no worker listener; 0: any free port
  // The OpenAI HTTP API (http_api.h) on `host`, with the client port's TLS
  // and authentication. -1: none; 0: any free port. Requests name the model
  // `model_name`.
  int http_port = -1;
  std::string model_name;
  int http_max_connections = 512;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;       // -1: no metrics endpoint; 0: any free port
  ServerTls tls;               // both listeners; tls.client_ca_file: mutual TLS on the client port
  std::string worker_ca_file;  // mutual TLS on the worker port
  std::string client_tokens_file;  // bearer tokens of clients (auth.h's token file)
  std::string worker_tokens_file;  // bearer tokens of workers
  // A token workers must send, instead of worker_tokens_file's: the one a
  // coordinator makes when it is given no worker credentials (worker_token.h).
  std::string worker_token;
  bool insecure = false;  // serve a non-loopback host unauthenticated
  // HTTP/2, per listener: streams one connection may have open, the header
  // list (metadata) one call may send, and the memory gRPC may hold for all
  // connections (its ResourceQuota), so that no peer can grow the server
  // without bound.
  int max_connection_streams = 256;
  int max_metadata_bytes = 16 << 10;
  int64_t grpc_memory_bytes = int64_t{4} << 30;
  std::string model_dir;  // config.json and the tokenizer files
  CoordinatorOptions coordinator;
  RequestLimits limits;  // what one request may cost (docs/security.md, Limits)
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Shutdown()s

  int port() const;
  int worker_port() const;   // -1 when none
  int metrics_port() const;  // -1 when none
  int http_port() const;     // -1 when none
  Coordinator& coordinator();
  // SIGTERM's first half: health NOT_SERVING, no new requests (UNAVAILABLE),
  // and up to `timeout` for the admitted ones to finish. Returns how many
  // had not; Shutdown ends those with UNAVAILABLE.
  int64_t Drain(std::chrono::duration<double> timeout);  // Coordinator::CutDrain ends it early
  void Shutdown();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltaserve
