#include "runtime/serving/http_api.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <condition_variable>
#include <limits>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/log.h"
#include "runtime/common/random_bytes.h"
#include "runtime/serving/listen_socket.h"
#include "runtime/serving/openai_api.h"

namespace deltaserve {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// A request head: the request line and headers, which a bearer token and a
// client's usual headers fit well within.
constexpr uint32_t kMaxHeadBytes = 16 << 10;
// What a connection's read buffer holds at most: a head, or a chunk header
// line, or a chunked body's trailer section (which Beast's parser takes
// whole, with no limit of its own), with what the client sent after it. A
// body passes through it without staying: the parser moves it out as it
// comes.
constexpr size_t kMaxBufferBytes = 2 * kMaxHeadBytes;

// An unseeded request's seed; a fixed one if the kernel gives no random
// bytes (sampling still works).
uint64_t RandomSeed() {
  uint64_t seed = 0;
  if (!FillRandom(&seed, sizeof(seed)).ok()) seed = 0;
  return seed;
}

// One accepted connection. Its thread arms the deadline before each
// blocking read or write; the reaper shuts the socket down once it passes,
// which ends that read or write with an error.
struct Connection {
  int fd = -1;
  std::string source;  // whom it counts as for the per-address caps (PeerName)
  std::atomic<int64_t> deadline_ns{INT64_MAX};  // SteadyClock; INT64_MAX: none
  std::atomic<bool> cut{false};
  std::atomic<bool> done{false};
  // Guarded by the server's mu_: waiting for a head (from its first byte,
  // its TLS handshake included, or idle between requests); a whole head
  // has come; a request of it has authenticated.
  bool waiting = true;
  bool requested = false;
  bool authenticated = false;
  std::thread thread;

  void Arm(std::chrono::milliseconds timeout) {
    deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      (SteadyClock::now() + timeout).time_since_epoch())
                      .count();
  }
  void Disarm() { deadline_ns = INT64_MAX; }
  // Whether the peer has closed its side (or the connection broke).
  bool PeerGone() const {
    pollfd p{fd, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
};

// The memory request bodies (and their JSON trees while they are parsed)
// may hold, all connections together, and one principal's share of it.
class BodyBudget {
 public:
  BodyBudget(int64_t limit, int64_t per_principal) : limit_(limit), per_principal_(per_principal) {}

  // What one request holds: grown as its bytes arrive, given back whole
  // when it goes. The principal "" (a server that authenticates no one) has
  // no share of its own.
  class Reservation {
   public:
    Reservation(BodyBudget& budget, std::string principal)
        : budget_(budget), principal_(std::move(principal)) {}
    ~Reservation() { GrowTo(0); }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    // Holds `bytes` in all from now on: false (and unchanged) when that
    // would pass the budget or the principal's share.
    bool GrowTo(int64_t bytes) {
      if (!budget_.Move(principal_, bytes - held_)) return false;
      held_ = bytes;
      return true;
    }
    int64_t held() const { return held_; }
    // The most it could ever hold.
    int64_t cap() const {
      return principal_.empty() ? budget_.limit_ : std::min(budget_.limit_, budget_.per_principal_);
    }

   private:
    BodyBudget& budget_;
    const std::string principal_;
    int64_t held_ = 0;
  };

 private:
  bool Move(const std::string& principal, int64_t delta) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& mine = by_principal_[principal];
    if (delta > 0 &&
        (in_use_ + delta > limit_ || (!principal.empty() && mine + delta > per_principal_))) {
      if (mine == 0) by_principal_.erase(principal);
      return false;
    }
    in_use_ += delta;
    mine += delta;
    if (mine == 0) by_principal_.erase(principal);
    return true;
  }

  const int64_t limit_, per_principal_;
  std::mutex mu_;
  int64_t in_use_ = 0;                                     // guarded by mu_
  std::unordered_map<std::string, int64_t> by_principal_;  // guarded by mu_
};

// What parsing a JSON body costs beyond its bytes, estimated from the
// values it holds (a SAX pass that builds nothing): nlohmann's tree takes
// 16 bytes a value, up to twice that in a grown array, and a map node and
// key per member; a body of token ids ("1,") grew a server by 18 to 24
// times its size. The pass also refuses a key given twice in one object,
// which the tree would resolve silently (the last wins).
constexpr int64_t kTreeBytesPerValue = 48;
absl::StatusOr<int64_t> JsonValues(const std::string& body) {
  struct Counter : nlohmann::json_sax<nlohmann::json> {
    int64_t values = 0;
    std::vector<std::unordered_set<std::string>> keys;  // of each open object (or array)
    std::string duplicate;
    bool null() override { return ++values, true; }
    bool boolean(bool) override { return ++values, true; }
    bool number_integer(number_integer_t) override { return ++values, true; }
    bool number_unsigned(number_unsigned_t) override { return ++values, true; }
    bool number_float(number_float_t, const string_t&) override { return ++values, true; }
    bool string(string_t&) override { return ++values, true; }
    bool binary(binary_t&) override { return ++values, true; }
    bool start_object(std::size_t) override {
      keys.emplace_back();
      return ++values, true;
    }
    bool key(string_t& key) override {
      ++values;
      if (keys.empty() || keys.back().insert(key).second) return true;
      duplicate = key;
      return false;
    }
    bool end_object() override {
      keys.pop_back();
      return true;
    }
    bool start_array(std::size_t) override {
      keys.emplace_back();
      return ++values, true;
    }
    bool end_array() override {
      keys.pop_back();
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } counter;
  nlohmann::json::sax_parse(body, &counter, nlohmann::json::input_format_t::json, false);
  if (!counter.duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the body: the key \"", absl::CHexEscape(counter.duplicate.substr(0, 128)),
                     "\" is given twice in one object"));
  }
  return counter.values;  // those before a syntax error, which the parse proper names
}

}  // namespace

class HttpApi::Impl {
 public:
  Impl(const HttpApiOptions& options, Coordinator& coordinator, const Authenticator& auth,
       const RequestValidator& validator, const ChatFormat* chat, MetricsRegistry& metrics)
      : options_(options),
        coordinator_(coordinator),
        auth_(auth),
        validator_(validator),
        chat_(chat),
        requests_(metrics.AddCounter("deltaserve_http_requests_total",
                                     "HTTP API requests answered (any status).")),
        refused_(metrics.AddCounter(
            "deltaserve_http_connections_refused_total",
            "HTTP API connections refused (503, or closed on a TLS port): every one of "
            "--http-max-connections served a request or an authenticated client.")),
        reclaimed_(metrics.AddCounter(
            "deltaserve_http_connections_reclaimed_total",
            "HTTP API connections closed while they waited for a request head, to make room "
            "for a new one (too many such connections, in all or from one address).")),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()) {}

  absl::Status Listen() {
    if (options_.tls != nullptr) {
      // asio's context owns the SSL_CTX it wraps: it gets a reference of its own.
      SSL_CTX_up_ref(options_.tls->get());
      ssl_ = std::make_unique<asio::ssl::context>(options_.tls->get());
    }
    auto socket = ListenTcp(options_.host, options_.port, "the HTTP port");
    if (!socket.ok()) return socket.status();
    listen_fd_ = socket->fd;
    port_ = socket->port;
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      ::close(listen_fd_);
      return ErrnoStatus(errno, "the HTTP port: pipe2");
    }
    wake_read_ = pipe_fds[0];
    wake_write_ = pipe_fds[1];
    acceptor_ = std::thread([this] { Accept(); });
    reaper_ = std::thread([this] { Reap(); });
    return absl::OkStatus();
  }

  ~Impl() { Stop(); }

  int port() const { return port_; }
  void SetServing(bool serving) { serving_ = serving; }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    if (wake_write_ >= 0) {
      const char byte = 1;
      (void)!::write(wake_write_, &byte, 1);
    }
    if (acceptor_.joinable()) acceptor_.join();
    std::list<Connection> connections;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Connection& c : connections_) {
        if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
      }
      connections.splice(connections.end(), connections_);
      reaper_cv_.notify_all();
    }
    for (Connection& c : connections) c.thread.join();
    if (reaper_.joinable()) reaper_.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_read_ >= 0) ::close(wake_read_);
    if (wake_write_ >= 0) ::close(wake_write_);
  }

 private:
  void Accept() {
    while (true) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
      if (::poll(fds, 2, 1000) < 0 && errno != EINTR) break;
      if (fds[1].revents != 0) break;
      JoinFinished();
      if ((fds[0].revents & POLLIN) == 0) continue;
      sockaddr_storage addr{};
      socklen_t addr_length = sizeof(addr);
      const int fd =
          ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &addr_length, SOCK_CLOEXEC);
      if (fd < 0) continue;  // the peer gave up, or descriptors ran out for now
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::string source;
      PeerName(addr, &source);
      std::lock_guard<std::mutex> lock(mu_);
      if (!MakeRoom(source)) {
        Refuse(fd);
        continue;
      }
      Connection& c = connections_.emplace_back();
      c.fd = fd;
      c.source = std::move(source);
      c.Arm(options_.head_timeout);
      c.thread = std::thread([this, &c] {
        // Nothing thrown on a connection's thread may end the process: the
        // connection closes, the server goes on.
        try {
          Serve(c);
        } catch (const std::exception& e) {
          log::Warning("http", absl::StrCat("closed a connection after an error: ", e.what()));
        } catch (...) {
          log::Warning("http", "closed a connection after an unknown error");
        }
        // The reaper and Stop shut sockets down by this descriptor: it is
        // closed, and forgotten, under their lock, so that they never reach
        // a descriptor number the system has given to another file.
        {
          std::lock_guard<std::mutex> lock(mu_);
          ::close(c.fd);
          c.fd = -1;
        }
        c.done = true;
      });
    }
  }

  // The connection slots, under mu_. Connections that wait for a head give
  // way to new ones, oldest first: those that have sent no whole head yet
  // (the unrequested), then those that have authenticated no request (the
  // unauthenticated: a health check, a refused key), each with a cap in all
  // and per address (HttpApiOptions); of the new connection's own address
  // when that has its share, else of the address with the most. A
  // connection serving a request, or an authenticated one waiting for its
  // next, never gives way. False when there is no room for one more.
  enum class Tier { kUnrequested, kUnauthenticated };
  bool InTier(const Connection& c, Tier tier) const {
    if (c.cut || c.done || !c.waiting) return false;
    return tier == Tier::kUnrequested ? !c.requested : !c.authenticated;
  }
  // How many of the tier's connections there are from `source` (all: empty).
  int CountInTier(Tier tier, const std::string& source) const {
    int n = 0;
    for (const Connection& c : connections_) {
      n += InTier(c, tier) && (source.empty() || c.source == source);
    }
    return n;
  }
  // Closes the oldest of the tier's connections from `source` (empty: the
  // source with the most): whether there was one.
  bool Reclaim(Tier tier, std::string source) {
    if (source.empty()) {
      std::unordered_map<std::string, int> by_source;
      int most = 0;
      for (const Connection& c : connections_) {
        if (!InTier(c, tier)) continue;
        const int n = ++by_source[c.source];
        if (n > most) {
          most = n;
          source = c.source;
        }
      }
      if (most == 0) return false;
    }
    for (Connection& c : connections_) {
      if (!InTier(c, tier) || c.source != source) continue;
      c.cut = true;
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
      reclaimed_.Add();
      return true;
    }
    return false;
  }
  bool MakeRoom(const std::string& source) {
    const int max = options_.max_connections;
    const int max_unrequested = std::max(1, max / 4),
              unrequested_per_source = std::max(1, max / 16);
    const int max_unauthenticated = std::max(1, max / 2);
    const int unauthenticated_per_source = std::max(1, max / 8);
    if (CountInTier(Tier::kUnrequested, source) >= unrequested_per_source) {
      Reclaim(Tier::kUnrequested, source);
    }
    if (CountInTier(Tier::kUnrequested, "") >= max_unrequested) Reclaim(Tier::kUnrequested, "");
    if (CountInTier(Tier::kUnauthenticated, source) >= unauthenticated_per_source) {
      Reclaim(Tier::kUnauthenticated, source);
    }
    if (CountInTier(Tier::kUnauthenticated, "") >= max_unauthenticated) {
      Reclaim(Tier::kUnauthenticated, "");
    }
    int open = 0;
    for (const Connection& c : connections_) open += !c.cut && !c.done;
    return open < max || Reclaim(Tier::kUnrequested, "") || Reclaim(Tier::kUnauthenticated, "");
  }

  // Every slot serves a request or an authenticated client: 503 on a
  // plaintext port; on a TLS port (whose client expects a handshake, not
  // an HTTP response) the connection is closed.
  void Refuse(int fd) {
    refused_.Add();
    if (ssl_ == nullptr) {
      static const std::string busy = [] {
        const std::string body =
            ErrorResponse(absl::UnavailableError("too many open connections; try again")).body;
        return absl::StrCat(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Connection: close\r\nContent-Length: ",
            body.size(), "\r\n\r\n", body);
      }();
      (void)!::send(fd, busy.data(), busy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    ::close(fd);
  }

  // Marks the connection's state for the slots (MakeRoom).
  void SetWaiting(Connection& c, bool waiting) {
    std::lock_guard<std::mutex> lock(mu_);
    c.waiting = waiting;
    if (!waiting) c.requested = true;
  }
  void SetAuthenticated(Connection& c) {
    std::lock_guard<std::mutex> lock(mu_);
    c.authenticated = true;
  }

  // Joins the threads of connections that have ended.
  void JoinFinished() {
    std::list<Connection> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = connections_.begin(); it != connections_.end();) {
        auto next = std::next(it);
        if (it->done) finished.splice(finished.end(), connections_, it);
        it = next;
      }
    }
    for (Connection& c : finished) c.thread.join();
  }

  void Reap() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      reaper_cv_.wait_for(lock, std::chrono::milliseconds(50));
      const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              SteadyClock::now().time_since_epoch())
                              .count();
      for (Connection& c : connections_) {
        if (c.fd >= 0 && !c.cut && c.deadline_ns.load() < now) {
          c.cut = true;
          ::shutdown(c.fd, SHUT_RDWR);
        }
      }
    }
  }

  // One connection, until it closes or breaks. The socket gets a
  // descriptor of its own (a dup), which it closes; c.fd stays the
  // thread's until it returns.
  void Serve(Connection& c) {
    int family = AF_INET;
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    if (::getsockname(c.fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
      family = addr.ss_family;
    }
    const tcp protocol = family == AF_INET6 ? tcp::v6() : tcp::v4();
    beast::error_code ec;
    const int own = ::fcntl(c.fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) return;
    if (ssl_ == nullptr) {
      tcp::socket socket(io_);
      socket.assign(protocol, own, ec);
      if (ec) {
        ::close(own);
        return;
      }
      ServeStream(socket, c, std::nullopt);
      socket.shutdown(tcp::socket::shutdown_send, ec);
      return;
    }
    asio::ssl::stream<tcp::socket> stream(io_, *ssl_);
    stream.next_layer().assign(protocol, own, ec);
    if (ec) {
      ::close(own);
      return;
    }
    // Under the deadline armed at accept: the handshake and the head that
    // follows share it.
    stream.handshake(asio::ssl::stream_base::server, ec);
    if (ec) return;
    std::optional<std::string> identity;
    if (const X509* cert = SSL_get0_peer_certificate(stream.native_handle())) {
      identity = CertificateIdentity(cert);
    }
    ServeStream(stream, c, identity);
    c.Arm(std::chrono::milliseconds(1000));
    stream.shutdown(ec);
  }

  template <typename Stream>
  void ServeStream(Stream& stream, Connection& c, const std::optional<std::string>& identity) {
    beast::flat_buffer buffer(kMaxBufferBytes);
    for (bool first = true; !c.cut; first = false) {
      // A head within head_timeout: of connecting (armed at accept, the TLS
      // handshake included) for the first, of the last response for the
      // next.
      if (!first) {
        SetWaiting(c, true);
        c.Arm(options_.head_timeout);
      }
      http::request_parser<http::string_body> parser;
      parser.header_limit(kMaxHeadBytes);
      // The head's Content-Length is checked below, once the caller is
      // known; Beast's own check would end the read of the head first. (Not
      // boost::none: Boost 1.74's parser takes any length as over it.)
      parser.body_limit(std::numeric_limits<uint64_t>::max());
      beast::error_code ec;
      http::read_header(stream, buffer, parser, ec);
      if (ec == http::error::header_limit) {
        Error(stream, c,
              absl::InvalidArgumentError(
                  absl::StrCat("the request head is over the limit of ", kMaxHeadBytes, " bytes")),
              431, false);
        return;
      }
      if (ec) return;  // closed, timed out, or not HTTP
      SetWaiting(c, false);
      c.Arm(options_.request_timeout);
      const auto& head = parser.get();
      const std::string path(head.target().substr(0, head.target().find('?')));
      if (path == "/health") {
        const bool ok = serving_.load();
        Respond(stream, c, ok ? 200 : 503, "application/json",
                ok ? R"({"status":"ok"})" : R"({"status":"unavailable"})", head.keep_alive());
        // A body, if any, is not read: the connection cannot go on.
        if (parser.content_length().value_or(0) > 0 || parser.chunked()) return;
        if (!head.keep_alive()) return;
        continue;
      }
      if (absl::Status framing = CheckFraming(head, parser.chunked()); !framing.ok()) {
        Error(stream, c, framing, absl::IsUnimplemented(framing) ? 501 : 400, false);
        return;
      }
      std::optional<absl::string_view> authorization;
      if (auto it = head.find(http::field::authorization); it != head.end()) {
        authorization = absl::string_view(it->value().data(), it->value().size());
      }
      absl::StatusOr<std::string> principal = auth_.Authenticate(authorization, identity);
      if (!principal.ok()) {
        Error(stream, c, principal.status(), 0, false);
        return;
      }
      SetAuthenticated(c);
      const int64_t declared = static_cast<int64_t>(
          parser.content_length().value_or(static_cast<uint64_t>(options_.max_body_bytes)));
      if (declared > options_.max_body_bytes) {
        Error(stream, c, BodyTooLarge(declared), 413, false);
        return;
      }
      // The body's bytes are held as they come (not as the head declares
      // them: a stalled upload holds what it sent).
      BodyBudget::Reservation reservation(body_budget_, *principal);
      parser.body_limit(static_cast<uint64_t>(options_.max_body_bytes));
      if (auto it = head.find(http::field::expect);
          it != head.end() && beast::iequals(it->value(), "100-continue")) {
        http::response<http::empty_body> proceed{http::status::continue_, 11};
        http::write(stream, proceed, ec);
        if (ec) return;
      }
      const size_t head_fields = FieldCount(head);
      bool over_budget = false;
      while (!parser.is_done() && !ec) {
        http::read_some(stream, buffer, parser, ec);
        over_budget =
            !reservation.GrowTo(static_cast<int64_t>(parser.get().body().size() + buffer.size()));
        if (over_budget) break;
      }
      if (over_budget) {
        Error(stream, c, BodyBudgetFull(), 0, false);
        return;
      }
      if (ec == http::error::body_limit) {
        Error(stream, c, BodyTooLarge(options_.max_body_bytes + 1), 413, false);
        return;
      }
      if (ec == http::error::buffer_overflow) {
        Error(
            stream, c,
            absl::InvalidArgumentError(absl::StrCat(
                "a chunk header or the trailer is over the limit of ", kMaxBufferBytes, " bytes")),
            400, false);
        return;
      }
      if (ec) return;
      c.Disarm();
      const http::request<http::string_body>& req = parser.get();
      // Trailer fields (after a chunked body) join the head's: none is
      // taken, as no endpoint here reads one.
      if (FieldCount(req) != head_fields) {
        Error(stream, c,
              absl::InvalidArgumentError("trailer fields after a chunked body are not accepted"),
              400, false);
        return;
      }
      const bool keep = Handle(stream, c, req, path, *principal, reservation) && req.keep_alive();
      if (!keep) return;
    }
  }

  template <typename Fields>
  static size_t FieldCount(const Fields& fields) {
    return static_cast<size_t>(std::distance(fields.begin(), fields.end()));
  }

  // What the head says of its body's framing, and of itself, that this
  // server does not take: a Transfer-Encoding other than exactly `chunked`
  // (whose body would otherwise be read as none, and with keep-alive as the
  // next request); more than one Authorization (which of them counts would
  // be a guess).
  static absl::Status CheckFraming(const http::request_header<>& head, bool chunked) {
    const auto encodings = head.equal_range(http::field::transfer_encoding);
    if (encodings.first != encodings.second) {
      const auto value = encodings.first->value();
      const bool exactly_chunked =
          std::next(encodings.first) == encodings.second && chunked &&
          absl::EqualsIgnoreCase(
              absl::StripAsciiWhitespace(absl::string_view(value.data(), value.size())), "chunked");
      if (!exactly_chunked) {
        return absl::UnimplementedError(
            "Transfer-Encoding: only `chunked` is taken (or a Content-Length)");
      }
    }
    if (head.count(http::field::authorization) > 1) {
      return absl::InvalidArgumentError("more than one Authorization header");
    }
    return absl::OkStatus();
  }

  static absl::Status BodyBudgetFull() {
    return absl::UnavailableError(
        "the server is reading too many request bodies at once (or this caller's share of "
        "them); try again");
  }

  absl::Status BodyTooLarge(int64_t bytes) const {
    return absl::InvalidArgumentError(
        absl::StrCat("the body: ", bytes, " bytes, over the limit of ", options_.max_body_bytes,
                     " (--max-request-bytes + 1 MiB)"));
  }

  // Answers one request; false when the connection cannot go on.
  template <typename Stream>
  bool Handle(Stream& stream, Connection& c, const http::request<http::string_body>& req,
              const std::string& path, const std::string& principal,
              BodyBudget::Reservation& reservation) {
    const bool keep_alive = req.keep_alive();
    const bool completions = path == "/v1/completions";
    const bool chat = path == "/v1/chat/completions";
    if (path == "/v1/models") {
      if (req.method() != http::verb::get) return MethodNotAllowed(stream, c, "GET", keep_alive);
      return Respond(stream, c, 200, "application/json", ModelList(options_.model_name, created_),
                     keep_alive);
    }
    if (!completions && !chat) {
      return Error(stream, c,
                   absl::NotFoundError(absl::StrCat(
                       "no such endpoint: ", path.substr(0, 128),
                       " (this server has /v1/completions, /v1/chat/completions, /v1/models "
                       "and /health)")),
                   0, keep_alive);
    }
    if (req.method() != http::verb::post) return MethodNotAllowed(stream, c, "POST", keep_alive);
    return Generate(stream, c, req,
                    completions ? OpenAiEndpoint::kCompletions : OpenAiEndpoint::kChat, principal,
                    reservation);
  }

  template <typename Stream>
  bool MethodNotAllowed(Stream& stream, Connection& c, const char* allowed, bool keep_alive) {
    return Error(stream, c,
                 absl::InvalidArgumentError(absl::StrCat("this endpoint takes ", allowed)), 405,
                 keep_alive);
  }

  template <typename Stream>
  bool Generate(Stream& stream, Connection& c, const http::request<http::string_body>& req,
                OpenAiEndpoint endpoint, const std::string& principal,
                BodyBudget::Reservation& reservation) {
    const bool keep_alive = req.keep_alive();
    // A token id is at least two bytes of JSON ("1,"): the body holds at
    // most half its size in values, and the rest of a request far fewer.
    const int64_t max_values = static_cast<int64_t>(req.body().size()) / 2 + 4096;
    // Its tree counts against the budget while it is parsed.
    const int64_t body_bytes = reservation.held();
    const absl::StatusOr<int64_t> counted = JsonValues(req.body());
    if (!counted.ok()) return Error(stream, c, counted.status(), 0, keep_alive);
    const int64_t values = *counted;
    if (body_bytes + kTreeBytesPerValue * values > reservation.cap()) {
      return Error(stream, c,
                   absl::InvalidArgumentError(absl::StrCat(
                       "the body: ", values, " JSON values, whose parse would take ",
                       kTreeBytesPerValue * values, " bytes, over what one request may hold (",
                       reservation.cap(), ", --grpc-memory-bytes)")),
                   0, keep_alive);
    }
    if (!reservation.GrowTo(body_bytes + kTreeBytesPerValue * values)) {
      return Error(stream, c, BodyBudgetFull(), 0, keep_alive);
    }
    absl::StatusOr<OpenAiRequest> parsed =
        ParseOpenAiRequest(endpoint, req.body(), RandomSeed(), max_values);
    reservation.GrowTo(body_bytes);  // the tree is gone
    if (!parsed.ok()) return Error(stream, c, parsed.status(), 0, keep_alive);
    if (parsed->model != options_.model_name) {
      return Error(stream, c,
                   absl::NotFoundError(absl::StrCat(
                       "model: the model `", parsed->model.substr(0, 128),
                       "` does not exist; this server serves `", options_.model_name, "`")),
                   0, keep_alive);
    }
    absl::StatusOr<std::string> id = validator_.RequestId("");
    if (!id.ok()) return Error(stream, c, id.status(), 0, keep_alive);
    absl::StatusOr<ValidGenerate> valid = validator_.Generate(parsed->input);
    if (!valid.ok()) return Error(stream, c, valid.status(), 0, keep_alive);
    absl::StatusOr<RequestHandle> handle = coordinator_.SubmitGenerate(
        ScopedRequestId(principal, *id), principal, std::move(valid->prompt),
        std::move(valid->params), std::nullopt);
    if (!handle.ok()) return Error(stream, c, handle.status(), 0, keep_alive);
    OpenAiResponseId rid;
    rid.id = absl::StrCat(endpoint == OpenAiEndpoint::kChat ? "chatcmpl-" : "cmpl-",
                          id->substr(4));  // after "req-"
    rid.created = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    rid.model = options_.model_name;
    if (parsed->stream) return StreamResponse(stream, c, *parsed, rid, *handle, keep_alive);
    OpenAiTokens out;
    while (true) {
      std::vector<TokenEvent> tokens;
      std::optional<RequestOutcome> outcome = coordinator_.Poll(*handle, &tokens, kPollInterval);
      for (TokenEvent& e : tokens) {
        out.text += e.text;
        if (parsed->logprobs) out.tokens.push_back(std::move(e));
      }
      if (outcome) {
        if (!outcome->status.ok()) return Error(stream, c, outcome->status, 0, keep_alive);
        if (endpoint == OpenAiEndpoint::kCompletions) {
          return Respond(stream, c, 200, "application/json",
                         CompletionResponse(*parsed, rid, out, *outcome, coordinator_.tokenizer()),
                         keep_alive);
        }
        absl::StatusOr<ChatReply> reply =
            ParseReply(*chat_, out.text, parsed->input.prompt.chat.thinking);
        if (!reply.ok()) return Error(stream, c, reply.status(), 0, keep_alive);
        return Respond(stream, c, 200, "application/json",
                       ChatResponse(*parsed, rid, *reply, out, *outcome, coordinator_.tokenizer()),
                       keep_alive);
      }
      if (c.cut || c.PeerGone()) {
        coordinator_.Cancel(*handle, absl::CancelledError("the client went away"));
      }
    }
  }

  // A streamed response: server-sent events in chunked encoding, ending
  // with `data: [DONE]`. An error after the events began comes as an event
  // holding OpenAI's error object.
  template <typename Stream>
  bool StreamResponse(Stream& stream, Connection& c, const OpenAiRequest& req,
                      const OpenAiResponseId& rid, const RequestHandle& handle, bool keep_alive) {
    http::response<http::empty_body> res{http::status::ok, 11};
    res.set(http::field::server, "deltaserve");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.keep_alive(keep_alive);
    res.chunked(true);
    http::response_serializer<http::empty_body> serializer{res};
    beast::error_code ec;
    c.Arm(options_.write_timeout);
    http::write_header(stream, serializer, ec);
    c.Disarm();
    requests_.Add();
    auto event = [&](const std::string& data) {
      const std::string framed = absl::StrCat("data: ", data, "\n\n");
      c.Arm(options_.write_timeout);
      asio::write(stream, http::make_chunk(asio::buffer(framed)), ec);
      c.Disarm();
      return !ec;
    };
    if (ec) {
      coordinator_.Cancel(handle, absl::CancelledError("the client went away"));
    }
    bool first = true;
    int64_t offset = 0;
    std::optional<ChatStream> chat;
    std::string text;  // a chat's reply so far
    if (req.endpoint == OpenAiEndpoint::kChat) {
      chat.emplace(req, rid, *chat_, coordinator_.tokenizer());
    }
    auto send = [&](const std::vector<std::string>& chunks) {
      for (const std::string& chunk : chunks) {
        if (!event(chunk)) return false;
      }
      return true;
    };
    while (true) {
      std::vector<TokenEvent> tokens;
      std::optional<RequestOutcome> outcome = coordinator_.Poll(handle, &tokens, kPollInterval);
      if (!ec && !tokens.empty()) {
        bool sent = true;
        if (chat) {
          for (const TokenEvent& e : tokens) text += e.text;
          if (!req.logprobs) tokens.clear();
          sent = send(chat->Update(text, std::move(tokens)));
        } else {
          OpenAiTokens out;
          for (TokenEvent& e : tokens) {
            out.text += e.text;
            if (req.logprobs) out.tokens.push_back(std::move(e));
          }
          if (!out.text.empty() || !out.tokens.empty()) {
            sent = event(
                CompletionChunk(req, rid, out, offset, first, nullptr, coordinator_.tokenizer()));
            first = false;
            offset += static_cast<int64_t>(out.text.size());
          }
        }
        if (!sent) coordinator_.Cancel(handle, WriteFailure(c));
      }
      if (outcome) {
        if (ec) return false;
        bool sent = true;
        if (!outcome->status.ok()) {
          sent = event(ErrorResponse(outcome->status).body);
        } else if (chat) {
          absl::StatusOr<std::vector<std::string>> last = chat->Finish(text, *outcome);
          sent = last.ok() ? send(*last) : event(ErrorResponse(last.status()).body);
        } else {
          const std::string finish = FinishReasonName(outcome->reason);
          sent = event(CompletionChunk(req, rid, OpenAiTokens{}, offset, first, &finish,
                                       coordinator_.tokenizer()));
        }
        if (sent && outcome->status.ok() && req.include_usage) {
          sent = event(UsageChunk(req, rid, *outcome));
        }
        if (!sent || !event("[DONE]")) return false;
        c.Arm(options_.write_timeout);
        asio::write(stream, http::make_chunk_last(), ec);
        c.Disarm();
        return !ec;
      }
      if (!ec && (c.cut || c.PeerGone())) {
        coordinator_.Cancel(handle, absl::CancelledError("the client went away"));
      }
    }
  }

  absl::Status WriteFailure(const Connection& c) const {
    if (c.cut) {
      return absl::CancelledError(absl::StrCat("the client did not read its stream for ",
                                               options_.write_timeout.count() / 1e3,
                                               " s (--client-write-timeout)"));
    }
    return absl::CancelledError("the client went away");
  }

  template <typename Stream>
  bool Error(Stream& stream, Connection& c, const absl::Status& status, int http_status,
             bool keep_alive) {
    OpenAiError e = ErrorResponse(status);
    if (http_status != 0) e.http_status = http_status;
    return Respond(stream, c, e.http_status, "application/json", std::move(e.body), keep_alive,
                   e.http_status == 401);
  }

  template <typename Stream>
  bool Respond(Stream& stream, Connection& c, int status, const char* content_type,
               std::string body, bool keep_alive, bool challenge = false) {
    requests_.Add();
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::server, "deltaserve");
    res.set(http::field::content_type, content_type);
    if (challenge) res.set(http::field::www_authenticate, "Bearer");
    res.keep_alive(keep_alive);
    res.body() = std::move(body);
    res.prepare_payload();
    beast::error_code ec;
    c.Arm(options_.write_timeout);
    http::write(stream, res, ec);
    c.Disarm();
    return !ec && keep_alive;
  }

  const HttpApiOptions options_;
  Coordinator& coordinator_;
  const Authenticator& auth_;
  const RequestValidator& validator_;
  const ChatFormat* const chat_;  // null: no chat format (the validator refuses chats)
  Counter& requests_;
  Counter& refused_;
  Counter& reclaimed_;
  const int64_t created_;
  std::atomic<bool> serving_{false};
  BodyBudget body_budget_{options_.body_memory_bytes, options_.principal_body_memory_bytes};

  asio::io_context io_;  // sockets need one; all I/O here is blocking
  std::unique_ptr<asio::ssl::context> ssl_;
  int listen_fd_ = -1, wake_read_ = -1, wake_write_ = -1;
  int port_ = -1;
  std::thread acceptor_, reaper_;
  std::mutex mu_;
  std::condition_variable reaper_cv_;
  bool stopped_ = false;               // guarded by mu_
  std::list<Connection> connections_;  // guarded by mu_
};

HttpApi::HttpApi(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpApi::~HttpApi() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(
    const HttpApiOptions& options, Coordinator& coordinator, const Authenticator& auth,
    const RequestValidator& validator, const ChatFormat* chat, MetricsRegistry& metrics) {
  auto impl = std::make_unique<Impl>(options, coordinator, auth, validator, chat, metrics);
  if (absl::Status ok = impl->Listen(); !ok.ok()) return ok;
  return std::unique_ptr<HttpApi>(new HttpApi(std::move(impl)));
}

int HttpApi::port() const { return impl_->port(); }
void HttpApi::SetServing(bool serving) { impl_->SetServing(serving); }
void HttpApi::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace deltaserve
