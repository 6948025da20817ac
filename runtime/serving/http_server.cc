#include "runtime/serving/http_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/listen_socket.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

// How long a connection whose response is sent is kept open to read (and
// drop) whatever else the client sent: closing a socket with unread input
// makes the kernel send a reset, which can destroy the response before the
// client has read it.
constexpr std::chrono::milliseconds kMaxLinger{1000};
// After accept() fails for lack of descriptors or memory, wait this long
// before trying again instead of spinning on the readable listening socket.
constexpr std::chrono::milliseconds kAcceptBackoff{100};

void CloseFd(int fd) {
  if (fd >= 0) ::close(fd);
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      break;
  }
  if (status < 200) return "Informational";
  if (status < 300) return "Success";
  if (status < 400) return "Redirection";
  if (status < 500) return "Client Error";
  return "Server Error";
}

std::string BuildResponse(int status, absl::string_view content_type, absl::string_view body,
                          bool head_only, absl::string_view extra_headers = {}) {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n", "Content-Type: ", content_type,
      "\r\n", "Content-Length: ", body.size(), "\r\n", extra_headers, "Connection: close\r\n\r\n");
  if (!head_only) out.append(body.data(), body.size());
  return out;
}

std::string ErrorResponse(int status, absl::string_view extra_headers = {}) {
  return BuildResponse(status, "text/plain; charset=utf-8",
                       absl::StrCat(status, " ", ReasonPhrase(status), "\n"),
                       /*head_only=*/false, extra_headers);
}

// RFC 9110 tchar: what a method or header name is made of.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

// Where the request head (request line and headers) ends, just past its
// blank line, or npos. Bare LF line ends are accepted, as RFC 9112 allows.
size_t FindHeadEnd(absl::string_view buffer) {
  const size_t crlf = buffer.find("\r\n\r\n");
  const size_t lf = buffer.find("\n\n");
  if (crlf == absl::string_view::npos && lf == absl::string_view::npos)
    return absl::string_view::npos;
  if (lf == absl::string_view::npos || (crlf != absl::string_view::npos && crlf + 2 <= lf)) {
    return crlf + 4;
  }
  return lf + 2;
}

struct ParsedHead {
  int error_status = 0;  // 0: `request` is good to hand to the handler
  HttpRequest request;
};

// Parses `head` (ending with its blank line): the request line, then header
// lines checked for form only, since none changes how we answer.
ParsedHead ParseHead(absl::string_view head) {
  ParsedHead parsed;
  std::vector<absl::string_view> lines;
  while (!head.empty()) {
    const size_t newline = head.find('\n');
    absl::string_view line = head.substr(0, newline);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    head.remove_prefix(newline == absl::string_view::npos ? head.size() : newline + 1);
  }
  // The last line is the blank one that ended the head.
  if (lines.size() < 2 || !lines.back().empty()) {
    parsed.error_status = 400;
    return parsed;
  }
  lines.pop_back();

  // request-line = method SP request-target SP HTTP-version
  const absl::string_view request_line = lines[0];
  const size_t sp1 = request_line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos ||
      request_line.find(' ', sp2 + 1) != absl::string_view::npos) {
    parsed.error_status = 400;
    return parsed;
  }
  const absl::string_view method = request_line.substr(0, sp1);
  const absl::string_view target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const absl::string_view version = request_line.substr(sp2 + 1);
  if (!IsToken(method) || version.size() != 8 || version.substr(0, 5) != "HTTP/" ||
      version[6] != '.' || !std::isdigit(static_cast<unsigned char>(version[5])) ||
      !std::isdigit(static_cast<unsigned char>(version[7]))) {
    parsed.error_status = 400;
    return parsed;
  }
  if (version != "HTTP/1.0" && version != "HTTP/1.1") {
    parsed.error_status = 505;
    return parsed;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    // Also rejects obsolete line folding (a line starting with white space).
    if (colon == absl::string_view::npos || !IsToken(lines[i].substr(0, colon))) {
      parsed.error_status = 400;
      return parsed;
    }
  }
  if (method != "GET" && method != "HEAD") {
    parsed.error_status = 405;
    return parsed;
  }
  // Origin form only ("/path?query"); no control characters or DEL.
  if (target.empty() || target[0] != '/' || std::any_of(target.begin(), target.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x21 || c == 0x7f;
      })) {
    parsed.error_status = 400;
    return parsed;
  }
  parsed.request.method = std::string(method);
  const size_t question = target.find('?');
  parsed.request.path = std::string(target.substr(0, question));
  if (question != absl::string_view::npos)
    parsed.request.query = std::string(target.substr(question + 1));
  return parsed;
}

struct Connection {
  enum class State { kReading, kWriting, kLingering };
  int fd = -1;  // -1 once closed
  State state = State::kReading;
  std::string in;
  std::string out;
  size_t sent = 0;
  Clock::time_point deadline;
};

void Close(Connection& conn) {
  CloseFd(conn.fd);
  conn.fd = -1;
}

// Sends what it can of conn.out; once all is sent, half-closes and lingers.
void TryWrite(Connection& conn, const HttpServerOptions& options, Clock::time_point now) {
  while (conn.sent < conn.out.size()) {
    // MSG_NOSIGNAL: a client that went away is an EPIPE here, not a SIGPIPE
    // that kills the process.
    const ssize_t n =
        ::send(conn.fd, conn.out.data() + conn.sent, conn.out.size() - conn.sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Close(conn);
      return;
    }
    conn.sent += static_cast<size_t>(n);
  }
  ::shutdown(conn.fd, SHUT_WR);
  conn.state = Connection::State::kLingering;
  conn.out.clear();
  conn.deadline = now + std::min(options.io_timeout, kMaxLinger);
}

void Respond(Connection& conn, std::string response, const HttpServerOptions& options,
             Clock::time_point now) {
  conn.state = Connection::State::kWriting;
  conn.in.clear();
  conn.out = std::move(response);
  conn.sent = 0;
  conn.deadline = now + options.io_timeout;
  TryWrite(conn, options, now);
}

std::string Dispatch(const HttpServer::Handler& handler, const HttpRequest& request) {
  HttpResponse response;
  try {
    response = handler(request);
  } catch (const std::exception&) {
    return ErrorResponse(500);
  } catch (...) {
    return ErrorResponse(500);
  }
  // A status the status line cannot carry, or a content type that would
  // split the header, is the handler's bug: do not put it on the wire.
  if (response.status < 100 || response.status > 599 ||
      response.content_type.find_first_of("\r\n") != std::string::npos) {
    return ErrorResponse(500);
  }
  return BuildResponse(response.status, response.content_type, response.body,
                       /*head_only=*/request.method == "HEAD");
}

// Reads what has arrived; answers once the request head is complete.
void ReadRequest(Connection& conn, const HttpServer::Handler& handler,
                 const HttpServerOptions& options, Clock::time_point now) {
  bool eof = false;
  char chunk[4096];
  while (conn.in.size() <= options.max_request_head_bytes) {
    const ssize_t n = ::recv(conn.fd, chunk, sizeof(chunk), 0);
    if (n > 0) {
      conn.in.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    Close(conn);  // reset by the peer, or worse: no one to answer
    return;
  }
  const size_t head_end = FindHeadEnd(conn.in);
  if (head_end != std::string::npos && head_end <= options.max_request_head_bytes) {
    const ParsedHead parsed = ParseHead(absl::string_view(conn.in).substr(0, head_end));
    std::string response;
    if (parsed.error_status == 405) {
      response = ErrorResponse(405, "Allow: GET, HEAD\r\n");
    } else if (parsed.error_status != 0) {
      response = ErrorResponse(parsed.error_status);
    } else {
      response = Dispatch(handler, parsed.request);
    }
    Respond(conn, std::move(response), options, now);
  } else if (conn.in.size() >= options.max_request_head_bytes) {
    Respond(conn, ErrorResponse(431), options, now);
  } else if (eof) {
    // A connection closed before sending anything (a port probe) gets no
    // answer; a request cut short gets a 400 it may still read.
    if (conn.in.empty()) {
      Close(conn);
    } else {
      Respond(conn, ErrorResponse(400), options, now);
    }
  }
}

// Reads and drops input until the client closes.
void Linger(Connection& conn) {
  char chunk[4096];
  while (true) {
    const ssize_t n = ::recv(conn.fd, chunk, sizeof(chunk), 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Close(conn);  // EOF or error
    return;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, int port,
                                                              Handler handler,
                                                              const HttpServerOptions& options) {
  const std::string where = HostPort(host, port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP server on ", where, ": bad port"));
  }
  if (!handler) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP server on ", where, ": no handler"));
  }
  if (options.io_timeout <= std::chrono::milliseconds::zero() ||
      options.max_request_head_bytes < 16 || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP server on ", where,
                     ": io_timeout, max_request_head_bytes (>= 16) and max_connections "
                     "must be positive"));
  }

  DELTASERVE_ASSIGN_OR_RETURN(const ListeningSocket listening,
                              ListenTcp(host, port, "HTTP server"));
  const int listen_fd = listening.fd;
  const int bound_port = listening.port;

  int wake[2];
  if (::pipe2(wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    const int err = errno;
    CloseFd(listen_fd);
    return ErrnoStatus(err, absl::StrCat("HTTP server on ", where, ": pipe"));
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(listen_fd, wake[0], wake[1], bound_port, std::move(handler), options));
  server->thread_ = std::thread(&HttpServer::Run, server.get());
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                       Handler handler, const HttpServerOptions& options)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      handler_(std::move(handler)),
      options_(options) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  const char byte = 1;
  ssize_t n;
  do {
    n = ::write(wake_write_fd_, &byte, 1);
  } while (n < 0 && errno == EINTR);
  if (thread_.joinable()) thread_.join();
  CloseFd(listen_fd_);
  CloseFd(wake_read_fd_);
  CloseFd(wake_write_fd_);
}

void HttpServer::Run() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  Clock::time_point accept_resume = Clock::time_point::min();
  const size_t max_connections = static_cast<size_t>(options_.max_connections);
  while (true) {
    Clock::time_point now = Clock::now();
    const bool accepting = conns.size() < max_connections && now >= accept_resume;
    fds.clear();
    fds.push_back({wake_read_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // fd -1: not polled
    Clock::time_point wake_at = Clock::time_point::max();
    if (conns.size() < max_connections && !accepting) wake_at = accept_resume;
    for (const Connection& conn : conns) {
      const bool writing = conn.state == Connection::State::kWriting;
      fds.push_back({conn.fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      wake_at = std::min(wake_at, conn.deadline);
    }
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {
      // Rounded up, so a deadline is never polled for early and spun on.
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now);
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 60'000));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[0].revents != 0) break;  // Stop()

    now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& conn = conns[i];
      if (fds[i + 2].revents != 0) {
        switch (conn.state) {
          case Connection::State::kReading:
            ReadRequest(conn, handler_, options_, now);
            break;
          case Connection::State::kWriting:
            TryWrite(conn, options_, now);
            break;
          case Connection::State::kLingering:
            Linger(conn);
            break;
        }
      }
      // Too slow to send its request or take its response, or done
      // lingering: no answer is owed any more.
      if (conn.fd >= 0 && now >= conn.deadline) Close(conn);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(),
                               [](const Connection& conn) { return conn.fd < 0; }),
                conns.end());

    if (fds[1].revents != 0) {
      while (conns.size() < max_connections) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          // The connection died in the backlog: take the next one.
          if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
          // Out of descriptors or memory: the socket stays readable, so back
          // off rather than spin.
          accept_resume = now + kAcceptBackoff;
          break;
        }
        Connection conn;
        conn.fd = fd;
        conn.deadline = now + options_.io_timeout;
        conns.push_back(std::move(conn));
      }
    }
  }
  for (Connection& conn : conns) Close(conn);
}

}  // namespace deltaserve
