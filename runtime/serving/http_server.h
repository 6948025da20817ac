// A minimal HTTP/1.1 server for Prometheus scraping (GET /metrics) and
// similar tiny endpoints: one request per connection, answered with
// Content-Length and `Connection: close`.
//
// One background thread runs a poll() loop over the listening socket and all
// open connections, so a slow or silent client delays no one: each connection
// must deliver its request head within `io_timeout` of connecting, and take
// its response within `io_timeout` of it being ready, or it is dropped. The
// handler runs on that thread, so it must be quick (rendering metrics is).
//
// Requests: GET and HEAD go to the handler; other methods get 405, a
// malformed request 400, a request head over `max_request_head_bytes` 431.
// Request bodies and headers are not passed on.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace deltaserve {

struct HttpRequest {
  std::string method;  // "GET" or "HEAD"
  std::string path;    // the request target up to '?', e.g. "/metrics"
  std::string query;   // after '?', without it; empty if none
};

struct HttpResponse {
  int status = 200;  // 100..599; anything else is answered as 500
  std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
  std::string body;  // not sent for HEAD; Content-Length still says its size
};

struct HttpServerOptions {
  // How long a client may take to send its request head, and to take the
  // response; a connection past it is closed.
  std::chrono::milliseconds io_timeout{5000};
  // Request line plus headers, up to and including the blank line.
  size_t max_request_head_bytes = 8192;
  // Open connections at once; more wait in the listen backlog.
  int max_connections = 64;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Listens on host:port (port 0: a free port, see port()) and serves on a
  // background thread until Stop() or destruction. host is a name or address
  // ("127.0.0.1", "::", "localhost"); empty means all interfaces. Errors name
  // host:port and the system's reason (e.g. the port is already in use).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host, int port,
                                                           Handler handler,
                                                           const HttpServerOptions& options = {});

  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Closes the listening socket and all connections (a handler call in
  // progress finishes first) and joins the thread. Idempotent. Must not be
  // called from the handler.
  void Stop();

  // The bound port: the one asked for, or the one the system picked for 0.
  int port() const { return port_; }

 private:
  HttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port, Handler handler,
             const HttpServerOptions& options);
  void Run();

  const int listen_fd_;
  const int wake_read_fd_;  // readable once Stop() has been called
  const int wake_write_fd_;
  const int port_;
  const Handler handler_;
  const HttpServerOptions options_;

  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
  std::thread thread_;
};

}  // namespace deltaserve
