// The OpenAI-compatible HTTP API of `deltaserve serve` and `coordinator`
// (--http-port): POST /v1/completions and /v1/chat/completions, streamed
// as server-sent events or not, GET /v1/models and GET /health, over
// HTTP/1.1 with keep-alive, TLS as on the gRPC ports, and the client tokens
// as API keys (`Authorization: Bearer`). Requests go through the same
// validator, coordinator, limits, drain and metrics as gRPC's; the JSON
// mapping is openai_api.h, docs/api.md the user's side.
//
// Transport: Boost.Beast (Debian's libboost-dev) parses and writes HTTP;
// each connection has a thread of its own doing blocking reads and
// writes, up to max_connections. Every read and write runs under a deadline
// that a reaper thread enforces by shutting the socket down, so a slow or
// silent peer holds its thread no longer than its timeout: a TLS handshake
// and the head after it, or the next head of a keep-alive connection,
// within head_timeout; the body within request_timeout of its head.
//
// Connections waiting for a head give way to new ones, as the gRPC guard's
// do (h2_guard.h): those that have sent no whole head yet may hold a
// quarter of max_connections, a sixteenth from one address (an IPv4
// address, an IPv6 /64), and those that have authenticated no request
// (health checks, refused keys, new connections) half of them, an eighth
// from one address; a new connection past a cap closes the oldest of its
// own address's, or of the address with the most. When every slot serves a
// request or an authenticated client, a new connection gets 503 (on a TLS
// port, a close). So sockets that send nothing, or a health check and then
// nothing, cannot lock callers out.
//
// A request is authenticated from its head, before its body is read; a
// body may not exceed max_body_bytes, and the bodies being read at once,
// with the JSON trees being parsed from them, may not exceed
// body_memory_bytes in all nor principal_body_memory_bytes for one caller
// (503 past it), so that no one, authenticated or not, can make the server
// hold more. A body is counted as its bytes arrive. A chunked body's
// chunk headers and trailer section share a bounded read buffer, and
// trailer fields are refused. Nothing thrown while serving a connection
// ends the server: the connection is logged and closed. A client that
// closes its connection cancels its request.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/serving/auth.h"
#include "runtime/serving/coordinator.h"
#include "runtime/serving/credentials.h"
#include "runtime/serving/metrics.h"
#include "runtime/serving/request_validation.h"
#include "runtime/tokenizer/chat_format.h"

namespace deltaserve {

struct HttpApiOptions {
  std::string host = "127.0.0.1";
  int port = 0;                                 // 0: any free port (see HttpApi::port)
  std::shared_ptr<const ServerTlsContext> tls;  // null: plaintext; made with TlsProtocol::kHttp11
  std::string model_name;                       // what /v1/models lists and requests name
  int max_connections = 512;
  // A request's head, from the connection's first byte (its TLS handshake
  // included) or from the previous response: an idle keep-alive connection
  // is closed after it too. A client sends its head within a round trip.
  std::chrono::milliseconds head_timeout{10000};
  // A request's body, from its head on.
  std::chrono::milliseconds request_timeout{30000};
  int64_t max_body_bytes = (64 << 20) + (1 << 20);
  // What request bodies being read (and their JSON while it is parsed, at
  // an estimated 48 bytes a value) may hold, all together and one
  // principal's ("" has no share of its own); a body holds what has come
  // of it, not what its head declares.
  int64_t body_memory_bytes = int64_t{4} << 30;
  int64_t principal_body_memory_bytes = int64_t{1} << 30;
  // A response (or one event of a stream) the client has not taken for
  // this long cancels its request.
  std::chrono::milliseconds write_timeout{60000};
};

class HttpApi {
 public:
  // Listens and serves on threads of its own until Stop() or destruction.
  // `coordinator`, `auth`, `validator` and `chat` (the model's chat format,
  // the validator's; null when it has none) must outlive it.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(
      const HttpApiOptions& options, Coordinator& coordinator, const Authenticator& auth,
      const RequestValidator& validator, const ChatFormat* chat, MetricsRegistry& metrics);
  ~HttpApi();  // Stop()s
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  int port() const;
  // GET /health answers 200 while serving (a worker attached, not
  // draining), 503 otherwise.
  void SetServing(bool serving);
  // Stops accepting, closes every connection and joins their threads; run
  // after the coordinator has ended its requests. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpApi(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltaserve
