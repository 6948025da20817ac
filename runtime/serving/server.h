// The gRPC server of `deltaserve coordinator` and `deltaserve serve`: the
// Generation API, the WorkerLink workers attach to, grpc.health.v1.Health
// (SERVING only while a worker is attached), server reflection, and
// Prometheus metrics over HTTP.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/serving/coordinator.h"
#include "runtime/serving/request_validation.h"

namespace deltaserve {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 50051;       // 0: any free port (see Server::port)
  int metrics_port = -1;  // -1: no metrics endpoint; 0: any free port
  std::string model_dir;  // config.json and the tokenizer files
  CoordinatorOptions coordinator;
  RequestLimits limits;  // what one request may cost (docs/security-limits.md)
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Shutdown()s

  int port() const;
  int metrics_port() const;  // -1 when none
  Coordinator& coordinator();
  void Shutdown();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltaserve
