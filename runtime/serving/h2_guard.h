// An HTTP/2 frame guard in front of gRPC's ports, plaintext (h2c) and TLS.
//
// gRPC 1.51 (Debian bookworm's, which we cannot replace) takes a header block
// that never ends (HEADERS without END_HEADERS, then CONTINUATION frames
// without end) into memory whole, whatever its metadata limit and
// ResourceQuota say, and keeps much of it after the connection closes
// (CVE-2023-33953, fixed in gRPC 1.56): 256 MiB of block grew a coordinator
// by about 280 MiB. A flood of PING frames does much the same (20,000 PINGs,
// 340 KB, grew it by 64 to 140 MiB, and it stayed). The guard owns the
// port's listening socket; each connection it accepts is relayed through a
// socketpair whose other end gRPC serves (grpc::AddInsecureChannelFromFd),
// and the bytes from the client are checked as they pass (H2FrameCheck). A
// connection that breaks a rule is closed on both sides: gRPC sees its end
// close and frees what it held.
//
// The guard also shares out its connection slots: a connection that has not
// yet sent a request (a whole HEADERS block) holds one only for a while, and
// such connections, from one address and from all, have a cap of their own,
// so that sockets which send nothing cannot lock out callers.
//
// On a TLS port the guard terminates TLS itself (OpenSSL, one context per
// port: ServerTlsContext), and relays the plaintext frames to gRPC as on a
// plaintext port. gRPC's own TLS listener would hand the decrypted frames
// straight to its parser, where the guard cannot read them: a flood of
// PINGs over TLS grew a coordinator from 25 to 264 MiB, and the memory
// stayed; and sockets that send nothing, or complete a handshake and then
// nothing, had no deadline or cap of ours. Terminated here, the same frame rules
// and slot caps hold for both kinds of port. With mutual TLS the guard
// verifies the client certificate against the port's CA, and the
// Authenticator asks it for the identity (PeerIdentity) of the connection a
// call came on, since gRPC sees only the plaintext socketpair.
//
// One thread runs an epoll loop over the listening socket and every
// connection, TLS handshakes and records included (non-blocking). Each
// direction of a connection has a fixed buffer; a side that cannot take
// more is not read from (backpressure: no buffer grows).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/serving/credentials.h"

namespace deltaserve {

struct H2Rules {
  // Bytes of one header block's frames, 9-byte frame headers included (so
  // that empty CONTINUATION frames count too): its HEADERS (or PUSH_PROMISE)
  // frame and CONTINUATION frames, whole, as HPACK compressed the headers.
  int64_t max_header_block_bytes = 48 << 10;
  // Control frames (PING, SETTINGS, RST_STREAM, WINDOW_UPDATE, PRIORITY,
  // GOAWAY, DATA with no data and no END_STREAM, frames of unknown types:
  // everything but request headers and data) go through a token bucket per
  // connection: it holds control_frame_burst frames, full at the start, and
  // gains control_frames_per_second, plus control_frames_per_frame_sent for
  // each DATA or HEADERS frame relayed to the client and one for each PING
  // or SETTINGS (not for ACKs, or a PING flood would pay for itself). A
  // frame that finds it empty cuts the connection. Most of a real client's
  // control frames answer the server's: gRPC's C++ client sends a stream and
  // a connection WINDOW_UPDATE for a message it reads, BDP pings with them,
  // and ACKs. The rest are a few at the start and keepalive pings (at most
  // one a second: gRPC's own limit on these ports). docs/security.md has
  // what real clients used, and where other servers draw the line.
  int64_t control_frame_burst = 1000;
  int64_t control_frames_per_second = 100;
  int64_t control_frames_per_frame_sent = 4;
};

// The client-to-server byte stream of one connection, checked as it passes,
// holding at most a frame header (9 bytes) of it: the client preface first;
// once a header block opens, only CONTINUATION frames of its stream until
// END_HEADERS; no CONTINUATION outside a block; no block over
// max_header_block_bytes; control frames within their bucket. Frame lengths
// are gRPC's to check: it raises its SETTINGS_MAX_FRAME_SIZE with its
// bandwidth estimate (up to 16 MiB), and the guard holds no frame, so a long
// one costs it nothing.
class H2FrameCheck {
 public:
  using Clock = std::chrono::steady_clock;

  explicit H2FrameCheck(const H2Rules& rules);

  // The next bytes from the client, in order, as they came at `now` (which
  // never goes back): OK, or why the connection must be closed (every later
  // call returns that too). The verdict on bytes given at one time does not
  // depend on how they are cut into calls.
  absl::Status Consume(absl::string_view bytes, Clock::time_point now);
  // The next bytes that went to the client, in order: their frames earn
  // control frames (H2Rules).
  void Sent(absl::string_view bytes);
  // Whether the client preface has come whole.
  bool preface_received() const;
  // Whether a request has come: a whole HEADERS block.
  bool requested() const { return requested_; }

 private:
  absl::Status OnFrameHeader();
  absl::Status OnControlFrame();

  const H2Rules rules_;
  size_t preface_matched_ = 0;
  unsigned char header_[9] = {};
  size_t header_bytes_ = 0;
  uint32_t payload_left_ = 0;
  bool in_block_ = false;
  bool block_is_request_ = false;  // the open block began with HEADERS
  bool requested_ = false;
  uint32_t block_stream_ = 0;
  int64_t block_bytes_ = 0;
  // A padded DATA frame whose pad length (its first payload byte) is next:
  // its length and whether it ends its stream.
  bool pad_length_next_ = false;
  uint32_t padded_length_ = 0;
  bool padded_ends_stream_ = false;
  // The server's frames, read for their headers alone: where in the current
  // one the bytes to the client are.
  unsigned char sent_header_[9] = {};
  size_t sent_header_bytes_ = 0;
  uint32_t sent_payload_left_ = 0;
  // The bucket: control frames allowed now, and when it was last filled.
  double tokens_;
  Clock::time_point filled_at_{};
  bool started_ = false;
  absl::Status error_;
};

struct H2GuardOptions {
  H2Rules rules;
  // Set: the port speaks TLS, terminated by the guard with this context (its
  // certificate, key and client CA); the frame rules and slots apply to what
  // the TLS records carry. A connection counts as having no request until
  // its handshake is done and a request has come.
  std::shared_ptr<const ServerTlsContext> tls;
  // Connections relayed at once. When all are taken, a new connection
  // closes the oldest that has not sent a request, if there is one; else it
  // waits in the listen backlog.
  int max_connections = 1024;
  // Connections that have not sent a request yet, at most: in all (the rest
  // of max_connections is kept for callers that have), and from one IPv4
  // address or IPv6 /64. A new connection over the second closes the oldest
  // of its own address's; over the first (or over max_connections), the
  // oldest of the address that has the most. A real client sends its first
  // request within a round trip of connecting.
  int max_unrequested = 256;
  int max_unrequested_per_address = 64;
  // Connections that have authenticated no call yet (MarkAuthenticated), at
  // most, in all and from one address, so that connections which send a
  // request that needs no credentials (a health check) and stay cannot fill
  // the slots either: the rest is kept for callers that have. A new
  // connection over either closes the oldest of them, as above.
  int max_unauthenticated = 512;
  int max_unauthenticated_per_address = 128;
  // How long a connection may stay open without sending a request.
  std::chrono::milliseconds request_timeout{10000};
  // Each direction's buffer, per connection.
  size_t buffer_bytes = 64 << 10;
  // Once gRPC has closed its end, how long the client has to take what gRPC
  // wrote last before the connection is closed: a client that does not read
  // would otherwise hold its place (and max_connections) for ever.
  std::chrono::milliseconds flush_after_close{5000};
  // Called on the guard's thread for each connection closed for breaking a
  // rule, with the peer's address and why (for the log and a metric).
  std::function<void(const std::string& peer, const absl::Status& why)> on_cut;
  // Called on the guard's thread for each connection closed to free its
  // slot (no request within request_timeout, or over a max_unrequested):
  // not logged per connection, as a flood of them is what it answers.
  std::function<void()> on_reclaim;
};

class H2Guard {
 public:
  // Takes gRPC's end of a new connection's socketpair (non-blocking,
  // close-on-exec), once the client preface has come; gRPC owns it from
  // then on.
  using Handoff = std::function<void(int fd)>;

  // Listens on host:port (port 0: a free one; see port()); Start() begins
  // accepting. `who` starts error messages ("the client port").
  static absl::StatusOr<std::unique_ptr<H2Guard>> Listen(const std::string& host, int port,
                                                         absl::string_view who,
                                                         H2GuardOptions options);
  ~H2Guard();  // Stop(0)s
  H2Guard(const H2Guard&) = delete;
  H2Guard& operator=(const H2Guard&) = delete;

  int port() const { return port_; }

  // Starts the thread; each accepted connection goes to `handoff` once its
  // client preface has come.
  absl::Status Start(Handoff handoff);
  // Closes the listening socket; once it returns, `handoff` is not called
  // again (the gRPC server may shut down). Open connections are relayed on.
  void StopAccepting();
  // Relays what is left until every connection has ended (gRPC closed its
  // end and the client got what gRPC wrote) or `grace` passed, then closes
  // the rest and joins the thread. Idempotent.
  void Stop(std::chrono::milliseconds grace);

  // From any thread: the connection gRPC knows as `grpc_peer` (its
  // ServerContext::peer(), "fd:N" for a socketpair this guard handed off)
  // authenticated a call, so it no longer gives way to others. Other peers
  // are ignored.
  void MarkAuthenticated(absl::string_view grpc_peer);
  // From any thread: the identity of the verified client certificate of the
  // connection gRPC knows as `grpc_peer` (CertificateIdentity; "" if the
  // certificate names nothing), or nullopt when that connection is not one
  // of this guard's open ones or presented no certificate.
  std::optional<std::string> PeerIdentity(absl::string_view grpc_peer) const;

  int64_t connections_cut() const { return cut_.load(); }
  // Connections closed to free their slot (on_reclaim).
  int64_t connections_reclaimed() const { return reclaimed_.load(); }

 private:
  struct Relay;
  H2Guard(int listen_fd, int wake_fd, int epoll_fd, int port, H2GuardOptions options);
  void Run();
  // The rest run on the guard's thread.
  // Gives gRPC a socketpair for `relay`: false if none could be made or the
  // port no longer accepts.
  bool HandOff(Relay* relay);
  // Pumps `relay` (handing it to gRPC once its preface has come) and settles
  // what that did: false if it is gone.
  bool PumpAndSettle(Relay* relay);
  // Forgets `relay` and closes its sockets.
  void Drop(Relay* relay);
  // Connections that give way first, oldest first, with their count per
  // source: those that have sent no request (kUnrequested), and those that
  // have authenticated no call (kUnauthenticated; the first are among them).
  static constexpr int kUnrequested = 0, kUnauthenticated = 1;
  struct Tier {
    explicit Tier(int index) : index(index) {}
    const int index;
    std::list<Relay*> relays;
    std::unordered_map<std::string, int> by_source;  // address or /64: count
  };
  void Join(Tier& tier, Relay* relay);
  void Leave(Tier& tier, Relay* relay);  // if it is in the tier
  // The marks MarkAuthenticated queued, applied.
  void TakeMarks();
  // Closes the oldest connection of `tier` from `source` (of the source with
  // the most, for ReclaimHeaviest) that is still in the tier once pumped:
  // whether one was closed or ended.
  bool ReclaimFrom(Tier& tier, const std::string& source);
  bool ReclaimHeaviest(Tier& tier);
  // Accepts what waits, within the caps.
  void AcceptAll(std::chrono::steady_clock::time_point* accept_resume);

  int listen_fd_;       // closed by the thread once accepting stops
  const int wake_fd_;   // an eventfd: StopAccepting and Stop write it
  const int epoll_fd_;  // the thread's
  const int port_;
  const H2GuardOptions options_;
  Handoff handoff_;

  std::mutex mu_;
  bool accepting_ = true;                          // guarded by mu_
  bool stopping_ = false;                          // guarded by mu_
  std::chrono::steady_clock::time_point stop_by_;  // guarded by mu_
  std::thread thread_;
  std::atomic<int64_t> cut_{0}, reclaimed_{0};

  // The guard thread's own.
  std::unordered_map<Relay*, std::unique_ptr<Relay>> relays_;
  std::unordered_set<Relay*> flushing_;  // gRPC closed them; the client has till flush_by
  Tier unrequested_{kUnrequested};
  Tier unauthenticated_{kUnauthenticated};
  std::unordered_map<int, Relay*> by_grpc_fd_;  // gRPC's end of each relay handed off

  std::mutex marks_mu_;
  std::vector<int> marks_;          // guarded by marks_mu_: to apply
  std::unordered_set<int> marked_;  // guarded by marks_mu_: queued or applied

  // The client certificate identities of the connections handed off with
  // one, by gRPC's descriptor, and whose they are (an entry goes with its
  // relay, not with a later one that got the same descriptor number).
  mutable std::mutex identities_mu_;
  std::unordered_map<int, std::pair<const Relay*, std::string>> identities_;  // guarded
};

}  // namespace deltaserve
