#include "runtime/serving/h2_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/common/log.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/listen_socket.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
constexpr uint8_t kData = 0x0, kHeaders = 0x1, kSettings = 0x4, kPushPromise = 0x5, kPing = 0x6,
                  kContinuation = 0x9;
constexpr uint8_t kEndStream = 0x1, kEndHeaders = 0x4, kPadded = 0x8;
// After accept() fails for lack of descriptors or memory, wait this long
// before trying again instead of spinning on the readable listening socket.
constexpr std::chrono::milliseconds kAcceptBackoff{100};
// Connections accepted per round of the loop at most: under a flood of
// connections the listening socket is never empty, and the connections
// already accepted (a caller's request among them) must be relayed too.
constexpr int kAcceptsPerRound = 64;

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

// The socket under a connection's TLS: OpenSSL's own socket BIO writes with
// write(2), and a write to a client that has gone would raise SIGPIPE and
// end the server; this one sends with MSG_NOSIGNAL, as the plaintext relay
// does. The BIO's data is the descriptor.
int SocketFd(BIO* bio) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio))); }

int SocketWrite(BIO* bio, const char* data, int n) {
  BIO_clear_retry_flags(bio);
  ssize_t sent;
  do {
    sent = ::send(SocketFd(bio), data, static_cast<size_t>(n), MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent >= 0) return static_cast<int>(sent);
  if (WouldBlock(errno)) BIO_set_retry_write(bio);
  return -1;
}

int SocketRead(BIO* bio, char* data, int n) {
  BIO_clear_retry_flags(bio);
  ssize_t got;
  do {
    got = ::recv(SocketFd(bio), data, static_cast<size_t>(n), 0);
  } while (got < 0 && errno == EINTR);
  if (got >= 0) return static_cast<int>(got);  // 0: the end of the client's stream
  if (WouldBlock(errno)) BIO_set_retry_read(bio);
  return -1;
}

long SocketCtrl(BIO*, int command, long, void*) { return command == BIO_CTRL_FLUSH ? 1 : 0; }

// A BIO over the non-blocking socket `fd` (not owned), or null.
BIO* SocketBio(int fd) {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "deltaserve socket");
    if (m != nullptr) {
      BIO_meth_set_write(m, SocketWrite);
      BIO_meth_set_read(m, SocketRead);
      BIO_meth_set_ctrl(m, SocketCtrl);
    }
    return m;
  }();
  BIO* bio = method == nullptr ? nullptr : BIO_new(method);
  if (bio == nullptr) return nullptr;
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  BIO_set_init(bio, 1);
  return bio;
}

// epoll_ctl(op) of `fd` for `events`, reported with `tag`.
void Watch(int epoll_fd, int op, int fd, uint32_t events, void* tag) {
  epoll_event event{};
  event.events = events;
  event.data.ptr = tag;
  ::epoll_ctl(epoll_fd, op, fd, &event);
}

}  // namespace

H2FrameCheck::H2FrameCheck(const H2Rules& rules)
    : rules_(rules), tokens_(static_cast<double>(rules.control_frame_burst)) {}

absl::Status H2FrameCheck::Consume(absl::string_view bytes, Clock::time_point now) {
  if (!started_) {
    started_ = true;
    filled_at_ = now;
  } else if (now > filled_at_) {
    const double seconds = std::chrono::duration<double>(now - filled_at_).count();
    tokens_ = std::min(static_cast<double>(rules_.control_frame_burst),
                       tokens_ + seconds * static_cast<double>(rules_.control_frames_per_second));
    filled_at_ = now;
  }
  size_t i = 0;
  while (error_.ok() && i < bytes.size()) {
    if (preface_matched_ < kPrefaceBytes) {
      const size_t n = std::min(kPrefaceBytes - preface_matched_, bytes.size() - i);
      if (std::memcmp(bytes.data() + i, kPreface + preface_matched_, n) != 0) {
        error_ = absl::InvalidArgumentError(
            "not the HTTP/2 client preface (a TLS or HTTP/1 client on a plaintext gRPC port?)");
        break;
      }
      preface_matched_ += n;
      i += n;
    } else if (payload_left_ > 0) {
      if (pad_length_next_) {
        // A padded DATA frame of nothing but padding is an empty one.
        pad_length_next_ = false;
        const uint32_t pad = static_cast<unsigned char>(bytes[i]);
        if (!padded_ends_stream_ && padded_length_ <= 1 + pad) {
          error_ = OnControlFrame();
          if (!error_.ok()) break;
        }
      }
      const size_t n = std::min<size_t>(payload_left_, bytes.size() - i);
      payload_left_ -= static_cast<uint32_t>(n);
      i += n;
    } else {
      header_[header_bytes_++] = static_cast<unsigned char>(bytes[i++]);
      if (header_bytes_ == sizeof(header_)) {
        header_bytes_ = 0;
        error_ = OnFrameHeader();
      }
    }
  }
  return error_;
}

absl::Status H2FrameCheck::OnFrameHeader() {
  const uint32_t length = uint32_t{header_[0]} << 16 | uint32_t{header_[1]} << 8 | header_[2];
  const uint8_t type = header_[3];
  const uint8_t flags = header_[4];
  const uint32_t stream = (uint32_t{header_[5]} << 24 | uint32_t{header_[6]} << 16 |
                           uint32_t{header_[7]} << 8 | header_[8]) &
                          0x7fffffffu;
  if (in_block_) {
    if (type != kContinuation || stream != block_stream_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a frame of type ", type, " on stream ", stream, " inside the header block of stream ",
          block_stream_, ": only its CONTINUATION frames may follow"));
    }
    block_bytes_ += sizeof(header_) + length;
  } else if (type == kContinuation) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CONTINUATION frame on stream ", stream, " with no header block open"));
  } else if (type == kHeaders || type == kPushPromise) {
    in_block_ = true;
    block_is_request_ = type == kHeaders;
    block_stream_ = stream;
    block_bytes_ = sizeof(header_) + length;
  } else if (type == kData) {
    if ((flags & kPadded) != 0 && length > 0) {
      pad_length_next_ = true;
      padded_length_ = length;
      padded_ends_stream_ = (flags & kEndStream) != 0;
    } else if (length == 0 && (flags & kEndStream) == 0) {
      DELTASERVE_RETURN_IF_ERROR(OnControlFrame());
    }
  } else {
    DELTASERVE_RETURN_IF_ERROR(OnControlFrame());
  }
  if (in_block_) {
    if (block_bytes_ > rules_.max_header_block_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a header block of over ", rules_.max_header_block_bytes, " bytes on stream ",
          block_stream_, " (its limit: twice --max-metadata-bytes, plus 16 KiB)"));
    }
    if (flags & kEndHeaders) {
      in_block_ = false;
      requested_ |= block_is_request_;
    }
  }
  payload_left_ = length;
  return absl::OkStatus();
}

bool H2FrameCheck::preface_received() const { return preface_matched_ == kPrefaceBytes; }

absl::Status H2FrameCheck::OnControlFrame() {
  if (tokens_ < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a flood of control frames (PING, SETTINGS, RST_STREAM, WINDOW_UPDATE, PRIORITY, "
        "empty DATA): over ",
        rules_.control_frame_burst, " at once, or over ", rules_.control_frames_per_second,
        " a second after that"));
  }
  tokens_ -= 1;
  return absl::OkStatus();
}

void H2FrameCheck::Sent(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    if (sent_payload_left_ > 0) {
      const size_t n = std::min<size_t>(sent_payload_left_, bytes.size() - i);
      sent_payload_left_ -= static_cast<uint32_t>(n);
      i += n;
      continue;
    }
    sent_header_[sent_header_bytes_++] = static_cast<unsigned char>(bytes[i++]);
    if (sent_header_bytes_ == sizeof(sent_header_)) {
      sent_header_bytes_ = 0;
      sent_payload_left_ =
          uint32_t{sent_header_[0]} << 16 | uint32_t{sent_header_[1]} << 8 | sent_header_[2];
      // What the client answers: window updates and pings for the data and
      // headers it reads, an ACK for a PING or SETTINGS. The server's own
      // ACKs earn nothing, or a PING flood would pay for itself.
      const uint8_t type = sent_header_[3];
      const bool ack = (sent_header_[4] & 0x1) != 0;
      int64_t earned = 0;
      if (type == kData || type == kHeaders) {
        earned = rules_.control_frames_per_frame_sent;
      } else if ((type == kPing || type == kSettings) && !ack) {
        earned = 1;
      }
      tokens_ = std::min(static_cast<double>(rules_.control_frame_burst),
                         tokens_ + static_cast<double>(earned));
    }
  }
}

// One relayed connection: the client's TCP socket and the guard's end of
// the socketpair whose other end gRPC serves.
struct H2Guard::Relay {
  // A fixed-size window of bytes on their way: [begin, end) of data.
  struct Buffer {
    explicit Buffer(size_t capacity) : data(new char[capacity]), capacity(capacity) {}
    size_t size() const { return end - begin; }
    // Free space at the end, moving what is left to the front when needed.
    size_t room() {
      if (begin == end) {
        begin = end = 0;
      } else if (end == capacity && begin > 0) {
        std::memmove(data.get(), data.get() + begin, size());
        end -= begin;
        begin = 0;
      }
      return capacity - end;
    }
    std::unique_ptr<char[]> data;
    size_t capacity, begin = 0, end = 0;
  };

  // `ssl`: the connection's TLS (owned), or null on a plaintext port.
  Relay(int tcp, SSL* ssl, std::string peer, std::string source, const H2GuardOptions& o)
      : tcp(tcp),
        ssl(ssl),
        source(std::move(source)),
        peer(std::move(peer)),
        accepted_at(Clock::now()),
        check(o.rules),
        up(o.buffer_bytes),
        down(o.buffer_bytes) {}
  ~Relay() {
    if (ssl != nullptr) {
      // close_notify if it fits in the socket now (the client may be gone);
      // OpenSSL allows none after a fatal error.
      if (handshaken && !tls_failed) {
        ERR_clear_error();
        SSL_shutdown(ssl);
      }
      SSL_free(ssl);
      ERR_clear_error();
    }
    ::close(tcp);
    if (inner >= 0) ::close(inner);
  }

  enum class State { kOpen, kEnded, kCut };
  // Moves bytes both ways until nothing moves: up (client to gRPC) through
  // the check, down (gRPC to client) as it is; before gRPC has the
  // connection (inner < 0), only into `up`. kEnded once gRPC has closed
  // its end and the client has what it wrote, or either side failed, or the
  // client left before gRPC had it; kCut (with *why) when the client broke a
  // rule.
  State Pump(absl::Status* why);
  // Whether gRPC has closed its end, also while bytes it wrote before still
  // wait in the socketpair behind a client that does not read.
  bool GrpcClosed() const {
    if (grpc_eof) return true;
    if (inner < 0) return false;
    pollfd p{inner, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP)) != 0;
  }

  // The client's side, through TLS on a TLS port: bytes moved (> 0), 0 at
  // the end of the client's stream, kWouldBlock, or kFailed (reset, or a TLS
  // error: a bad record or alert).
  static constexpr ssize_t kWouldBlock = -1, kFailed = -2;
  ssize_t ReadClient(char* data, size_t n);
  ssize_t WriteClient(const char* data, size_t n);
  // On a TLS port, moves the handshake on: 1 once it is done, 0 while it
  // waits for the socket, kFailed when it failed.
  ssize_t Handshake();

  const int tcp;
  SSL* const ssl;
  bool handshaken = false;  // a TLS port's handshake is done
  bool tls_failed = false;  // and a record or alert failed since
  // The verified client certificate's identity (CertificateIdentity), once
  // the handshake is done on a port with a client CA.
  std::optional<std::string> identity;
  // The guard's end of the socketpair to gRPC, made once the client preface
  // has come (-1 until then): a socket that sends nothing costs gRPC nothing.
  int inner = -1;
  const std::string source;  // whom it counts as (PeerName)
  const std::string peer;    // address and port, for the log
  const Clock::time_point accepted_at;
  H2FrameCheck check;
  Buffer up, down;
  bool client_eof = false, grpc_eof = false, up_shut = false;
  bool queued = false;                                    // in this round's list of relays to pump
  Clock::time_point flush_by = Clock::time_point::max();  // set once GrpcClosed()
  int grpc_fd = -1;  // gRPC's end of the socketpair, once handed off
  // In each Tier (kUnrequested, kUnauthenticated) or not, and where.
  bool in_tier[2] = {false, false};
  std::list<Relay*>::iterator tier_at[2];
};

ssize_t H2Guard::Relay::ReadClient(char* data, size_t n) {
  if (ssl == nullptr) {
    ssize_t got;
    do {
      got = ::recv(tcp, data, n, 0);
    } while (got < 0 && errno == EINTR);
    if (got >= 0) return got;
    return WouldBlock(errno) ? kWouldBlock : kFailed;
  }
  ERR_clear_error();
  const int got = SSL_read(ssl, data, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  if (got > 0) return got;
  switch (SSL_get_error(ssl, got)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return kWouldBlock;
    case SSL_ERROR_ZERO_RETURN:  // close_notify, or the end of the TCP stream
      return 0;
    default:
      tls_failed = true;
      return kFailed;
  }
}

ssize_t H2Guard::Relay::WriteClient(const char* data, size_t n) {
  if (ssl == nullptr) {
    ssize_t sent;
    do {
      sent = ::send(tcp, data, n, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent >= 0) return sent;
    return WouldBlock(errno) ? kWouldBlock : kFailed;
  }
  // A write that would block is retried with the same bytes at the front of
  // `down` (and maybe more after them): what SSL_write asks of a retry.
  ERR_clear_error();
  const int sent = SSL_write(ssl, data, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  if (sent > 0) return sent;
  const int error = SSL_get_error(ssl, sent);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return kWouldBlock;
  tls_failed = true;
  return kFailed;
}

ssize_t H2Guard::Relay::Handshake() {
  ERR_clear_error();
  const int done = SSL_do_handshake(ssl);
  if (done == 1) {
    handshaken = true;
    if (X509* cert = SSL_get1_peer_certificate(ssl); cert != nullptr) {
      // Verified against the port's client CA (the handshake fails otherwise).
      if (SSL_get_verify_result(ssl) == X509_V_OK) identity = CertificateIdentity(cert);
      X509_free(cert);
    }
    return 1;
  }
  const int error = SSL_get_error(ssl, done);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return 0;
  ERR_clear_error();
  return kFailed;  // not TLS, no certificate of the CA, no protocol in common
}

H2Guard::Relay::State H2Guard::Relay::Pump(absl::Status* why) {
  if (ssl != nullptr && !handshaken) {
    const ssize_t done = Handshake();
    if (done == kFailed) return State::kEnded;
    if (done == 0) return State::kOpen;  // the socket says when it can go on
  }
  bool moved = true;
  while (moved) {
    moved = false;
    if (const size_t room = up.room(); !client_eof && room > 0) {
      const ssize_t n = ReadClient(up.data.get() + up.end, room);
      if (n > 0) {
        if (absl::Status ok =
                check.Consume({up.data.get() + up.end, static_cast<size_t>(n)}, Clock::now());
            !ok.ok()) {
          *why = std::move(ok);
          return State::kCut;
        }
        up.end += static_cast<size_t>(n);
        moved = true;
      } else if (n == 0) {
        client_eof = moved = true;
      } else if (n == kFailed) {
        return State::kEnded;  // reset by the client, or a bad TLS record
      }
    }
    if (inner < 0) {
      if (client_eof) return State::kEnded;
      continue;  // up holds what came, until gRPC has the connection
    }
    if (up.size() > 0) {
      const ssize_t n = ::send(inner, up.data.get() + up.begin, up.size(), MSG_NOSIGNAL);
      if (n > 0) {
        up.begin += static_cast<size_t>(n);
        moved = true;
      } else if (!WouldBlock(errno)) {
        return State::kEnded;  // gRPC closed its end
      } else {
        moved |= errno == EINTR;
      }
    }
    if (client_eof && up.size() == 0 && !up_shut) {
      ::shutdown(inner, SHUT_WR);  // gRPC reads the end of the stream
      up_shut = true;
    }
    if (const size_t room = down.room(); !grpc_eof && room > 0) {
      const ssize_t n = ::recv(inner, down.data.get() + down.end, room, 0);
      if (n > 0) {
        down.end += static_cast<size_t>(n);
        moved = true;
      } else if (n == 0 || !WouldBlock(errno)) {
        grpc_eof = moved = true;
      } else {
        moved |= errno == EINTR;
      }
    }
    if (down.size() > 0) {
      const ssize_t n = WriteClient(down.data.get() + down.begin, down.size());
      if (n > 0) {
        check.Sent({down.data.get() + down.begin, static_cast<size_t>(n)});
        down.begin += static_cast<size_t>(n);
        moved = true;
      } else if (n == kFailed) {
        return State::kEnded;  // the client is gone
      }
    }
    if (grpc_eof && down.size() == 0) return State::kEnded;
  }
  return State::kOpen;
}

absl::StatusOr<std::unique_ptr<H2Guard>> H2Guard::Listen(const std::string& host, int port,
                                                         absl::string_view who,
                                                         H2GuardOptions options) {
  if (options.max_connections < 1 || options.buffer_bytes < 1024 ||
      options.rules.max_header_block_bytes < 1 || options.rules.control_frame_burst < 1 ||
      options.rules.control_frames_per_second < 0 ||
      options.rules.control_frames_per_frame_sent < 0 || options.max_unrequested < 1 ||
      options.max_unrequested_per_address < 1 || options.max_unauthenticated < 1 ||
      options.max_unauthenticated_per_address < 1 || options.request_timeout.count() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": the HTTP/2 guard's limits must be positive"));
  }
  DELTASERVE_ASSIGN_OR_RETURN(const ListeningSocket listening, ListenTcp(host, port, who));
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int err = errno;
  const int epoll = wake < 0 ? -1 : ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll < 0) {
    const int epoll_err = errno;
    ::close(listening.fd);
    if (wake >= 0) ::close(wake);
    return ErrnoStatus(wake < 0 ? err : epoll_err,
                       absl::StrCat(who, wake < 0 ? ": eventfd" : ": epoll_create1"));
  }
  return std::unique_ptr<H2Guard>(
      new H2Guard(listening.fd, wake, epoll, listening.port, std::move(options)));
}

H2Guard::H2Guard(int listen_fd, int wake_fd, int epoll_fd, int port, H2GuardOptions options)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      epoll_fd_(epoll_fd),
      port_(port),
      options_(std::move(options)) {}

H2Guard::~H2Guard() {
  Stop(std::chrono::milliseconds(0));
  ::close(epoll_fd_);
  ::close(wake_fd_);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

absl::Status H2Guard::Start(Handoff handoff) {
  handoff_ = std::move(handoff);
  try {
    thread_ = std::thread(&H2Guard::Run, this);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the HTTP/2 guard's thread: ", e.what()));
  }
  return absl::OkStatus();
}

void H2Guard::StopAccepting() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
  }
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void H2Guard::Stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    if (!stopping_) {
      stopping_ = true;
      stop_by_ = Clock::now() + grace;
    }
  }
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

bool H2Guard::HandOff(Relay* relay) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    return false;
  }
  {
    // Under the lock: once StopAccepting has returned, no handoff runs.
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) {
      ::close(pair[0]);
      ::close(pair[1]);
      return false;
    }
    handoff_(pair[0]);
  }
  {
    // A mark still waiting for an earlier connection that gRPC knew by this
    // descriptor is not this one's.
    std::lock_guard<std::mutex> lock(marks_mu_);
    marked_.erase(pair[0]);
    marks_.erase(std::remove(marks_.begin(), marks_.end(), pair[0]), marks_.end());
  }
  relay->grpc_fd = pair[0];
  by_grpc_fd_[pair[0]] = relay;
  if (relay->identity.has_value()) {
    std::lock_guard<std::mutex> lock(identities_mu_);
    identities_[pair[0]] = {relay, *relay->identity};
  }
  relay->inner = pair[1];
  Watch(epoll_fd_, EPOLL_CTL_ADD, relay->inner, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, relay);
  return true;
}

bool H2Guard::PumpAndSettle(Relay* relay) {
  absl::Status why;
  Relay::State state = relay->Pump(&why);
  if (state == Relay::State::kOpen && relay->inner < 0 && relay->check.preface_received()) {
    if (!HandOff(relay)) {
      Drop(relay);  // no descriptors, or the port is closing: the client may retry
      return false;
    }
    state = relay->Pump(&why);
  }
  if (state == Relay::State::kOpen) {
    if (relay->in_tier[kUnrequested] && relay->check.requested()) Leave(unrequested_, relay);
    if (!flushing_.count(relay) && relay->down.size() > 0 && relay->GrpcClosed()) {
      flushing_.insert(relay);
      relay->flush_by = Clock::now() + options_.flush_after_close;
    }
    return true;
  }
  if (state == Relay::State::kCut) {
    cut_.fetch_add(1);
    if (options_.on_cut) options_.on_cut(relay->peer, why);
  }
  Drop(relay);
  return false;
}

void H2Guard::Drop(Relay* relay) {
  Leave(unrequested_, relay);
  Leave(unauthenticated_, relay);
  if (relay->grpc_fd >= 0) {
    if (const auto it = by_grpc_fd_.find(relay->grpc_fd);
        it != by_grpc_fd_.end() && it->second == relay) {
      by_grpc_fd_.erase(it);
    }
    {
      std::lock_guard<std::mutex> lock(marks_mu_);
      marked_.erase(relay->grpc_fd);
    }
    std::lock_guard<std::mutex> lock(identities_mu_);
    if (const auto it = identities_.find(relay->grpc_fd);
        it != identities_.end() && it->second.first == relay) {
      identities_.erase(it);
    }
  }
  flushing_.erase(relay);
  relays_.erase(relay);  // closes both sockets: gRPC sees its end close
}

void H2Guard::Join(Tier& tier, Relay* relay) {
  relay->in_tier[tier.index] = true;
  relay->tier_at[tier.index] = tier.relays.insert(tier.relays.end(), relay);
  ++tier.by_source[relay->source];
}

void H2Guard::Leave(Tier& tier, Relay* relay) {
  if (!relay->in_tier[tier.index]) return;
  tier.relays.erase(relay->tier_at[tier.index]);
  relay->in_tier[tier.index] = false;
  const auto count = tier.by_source.find(relay->source);
  if (--count->second == 0) tier.by_source.erase(count);
}

void H2Guard::TakeMarks() {
  std::vector<int> marks;
  {
    std::lock_guard<std::mutex> lock(marks_mu_);
    marks.swap(marks_);
  }
  for (const int fd : marks) {
    const auto it = by_grpc_fd_.find(fd);
    if (it == by_grpc_fd_.end()) continue;
    Leave(unrequested_, it->second);  // it sent a request, which may be in flight still
    Leave(unauthenticated_, it->second);
  }
}

void H2Guard::MarkAuthenticated(absl::string_view grpc_peer) {
  int fd = -1;
  if (!absl::ConsumePrefix(&grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer, &fd) || fd < 0) {
    return;  // not a connection of this guard's
  }
  {
    std::lock_guard<std::mutex> lock(marks_mu_);
    if (!marked_.insert(fd).second) return;  // known already: the common case
    marks_.push_back(fd);
  }
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

std::optional<std::string> H2Guard::PeerIdentity(absl::string_view grpc_peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer, &fd) || fd < 0) {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(identities_mu_);
  const auto it = identities_.find(fd);
  if (it == identities_.end()) return std::nullopt;
  return it->second.second;
}

bool H2Guard::ReclaimFrom(Tier& tier, const std::string& source) {
  for (auto it = tier.relays.begin(); it != tier.relays.end();) {
    Relay* relay = *it++;  // Drop and Leave invalidate only relay's place
    if (relay->source != source) continue;
    // Its request may be waiting in the socket still.
    if (!PumpAndSettle(relay)) return true;
    if (!relay->in_tier[tier.index]) continue;
    reclaimed_.fetch_add(1);
    if (options_.on_reclaim) options_.on_reclaim();
    Drop(relay);
    return true;
  }
  return false;
}

bool H2Guard::ReclaimHeaviest(Tier& tier) {
  while (!tier.by_source.empty()) {
    // Of the source with the most: one client's slots do not go to another's
    // flood. Pumped, they may all turn out to have left the tier; then the
    // next.
    const auto most =
        std::max_element(tier.by_source.begin(), tier.by_source.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    if (ReclaimFrom(tier, std::string(most->first))) return true;
  }
  return false;
}

void H2Guard::AcceptAll(Clock::time_point* accept_resume) {
  const size_t max_connections = static_cast<size_t>(options_.max_connections);
  const size_t max_unrequested = static_cast<size_t>(options_.max_unrequested);
  const size_t max_unauthenticated = static_cast<size_t>(options_.max_unauthenticated);
  TakeMarks();
  // Every connection without a request is one without an authenticated call.
  for (int accepted = 0; accepted < kAcceptsPerRound &&
                         (relays_.size() < max_connections || !unauthenticated_.relays.empty());
       ++accepted) {
    sockaddr_storage addr{};
    socklen_t addr_len = sizeof(addr);
    const int tcp = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &addr_len,
                              SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (tcp < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        *accept_resume = Clock::now() + kAcceptBackoff;
      }
      return;  // EAGAIN: none waiting; ECONNABORTED and the like: the next round
    }
    std::string source;
    std::string peer = PeerName(addr, &source);
    // Room for it: what has waited longest without a request goes first,
    // then what has authenticated no call; of its own source when that has
    // its share, else of the source with the most.
    const auto over = [&](const Tier& tier, int per_address) {
      const auto same = tier.by_source.find(source);
      return same != tier.by_source.end() && same->second >= per_address;
    };
    if (over(unrequested_, options_.max_unrequested_per_address)) {
      ReclaimFrom(unrequested_, source);
    }
    if (unrequested_.relays.size() >= max_unrequested) ReclaimHeaviest(unrequested_);
    if (over(unauthenticated_, options_.max_unauthenticated_per_address)) {
      ReclaimFrom(unauthenticated_, source);
    }
    if (unauthenticated_.relays.size() >= max_unauthenticated) ReclaimHeaviest(unauthenticated_);
    if (relays_.size() >= max_connections && !ReclaimHeaviest(unrequested_) &&
        !ReclaimHeaviest(unauthenticated_)) {
      ::close(tcp);  // every connection authenticated meanwhile: none to give way
      return;
    }
    const int one = 1;
    ::setsockopt(tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SSL* ssl = nullptr;
    if (options_.tls != nullptr) {
      // The context holds the certificate, key and CA store: a connection
      // costs its own state only, made here and freed with it.
      ERR_clear_error();
      ssl = SSL_new(options_.tls->get());
      BIO* bio = ssl == nullptr ? nullptr : SocketBio(tcp);
      if (bio == nullptr) {
        SSL_free(ssl);
        ERR_clear_error();
        ::close(tcp);
        continue;  // out of memory: the client may retry
      }
      SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO
      SSL_set_accept_state(ssl);
    }
    auto owned = std::make_unique<Relay>(tcp, ssl, std::move(peer), std::move(source), options_);
    Relay* relay = owned.get();
    relays_.emplace(relay, std::move(owned));
    Join(unrequested_, relay);
    Join(unauthenticated_, relay);
    // Edge-triggered: Pump moves bytes until a side would block, and
    // adding a socket that is already readable reports it at once. gRPC's
    // end comes once the client preface has (HandOff).
    Watch(epoll_fd_, EPOLL_CTL_ADD, tcp, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, relay);
  }
}

void H2Guard::Run() {
  const int epoll_fd = epoll_fd_;
  // The listening socket and the eventfd are told apart by these tags; a
  // connection's two sockets point at its Relay.
  char listen_tag = 0, wake_tag = 0;
  Watch(epoll_fd, EPOLL_CTL_ADD, wake_fd_, EPOLLIN, &wake_tag);
  bool listening = false;  // listen_fd_ is in the epoll set
  Clock::time_point accept_resume = Clock::time_point::min();
  const size_t max_connections = static_cast<size_t>(options_.max_connections);
  std::vector<epoll_event> events(256);
  std::vector<Relay*> ready;

  while (true) {
    bool accepting, stopping;
    Clock::time_point stop_by;
    {
      std::lock_guard<std::mutex> lock(mu_);
      accepting = accepting_;
      stopping = stopping_;
      stop_by = stop_by_;
    }
    const Clock::time_point now = Clock::now();
    if (!accepting && listen_fd_ >= 0) {
      if (listening) ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd_, nullptr);
      listening = false;
      ::close(listen_fd_);
      listen_fd_ = -1;
    }
    if (stopping && (relays_.empty() || now >= stop_by)) break;
    for (auto it = flushing_.begin(); it != flushing_.end();) {
      Relay* relay = *it;
      if (now < relay->flush_by) {
        ++it;
        continue;
      }
      it = flushing_.erase(it);
      Drop(relay);
    }
    // Connections that sent no request in time (the list is in accept order).
    TakeMarks();
    while (!unrequested_.relays.empty() &&
           now - unrequested_.relays.front()->accepted_at >= options_.request_timeout) {
      reclaimed_.fetch_add(1);
      if (options_.on_reclaim) options_.on_reclaim();
      Drop(unrequested_.relays.front());
    }
    const bool want = listen_fd_ >= 0 &&
                      (relays_.size() < max_connections || !unauthenticated_.relays.empty()) &&
                      now >= accept_resume;
    if (want != listening) {
      Watch(epoll_fd, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, listen_fd_, EPOLLIN, &listen_tag);
      listening = want;
    }
    int timeout_ms = -1;
    const auto until = [&](Clock::time_point t) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
      const int ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    };
    if (stopping) until(stop_by);
    if (listen_fd_ >= 0 && now < accept_resume) until(accept_resume);
    for (Relay* relay : flushing_) until(relay->flush_by);
    if (!unrequested_.relays.empty()) {
      until(unrequested_.relays.front()->accepted_at + options_.request_timeout);
    }
    const int n =
        ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) {
      log::Error("server", absl::StrCat("the HTTP/2 guard on port ", port_,
                                        ": epoll_wait: ", std::strerror(errno)));
      break;
    }
    ready.clear();
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &wake_tag) {
        uint64_t count;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &count, sizeof(count));
      } else if (tag != &listen_tag) {
        Relay* relay = static_cast<Relay*>(tag);
        if (!relay->queued) ready.push_back(relay);
        relay->queued = true;
      }
    }
    for (Relay* relay : ready) {
      relay->queued = false;
      PumpAndSettle(relay);
    }
    if (listening) AcceptAll(&accept_resume);
  }
  for (Tier* tier : {&unrequested_, &unauthenticated_}) {
    tier->relays.clear();
    tier->by_source.clear();
  }
  by_grpc_fd_.clear();
  flushing_.clear();
  relays_.clear();
  std::lock_guard<std::mutex> lock(identities_mu_);
  identities_.clear();
}

}  // namespace deltaserve
