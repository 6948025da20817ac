// H2FrameCheck's rules on byte streams, and H2Guard's relay over real
// sockets with an echo peer in gRPC's place (the e2e test puts gRPC there):
// bytes both ways under backpressure, a cut that closes both sides, and
// stopping.
#include "runtime/serving/h2_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace deltaserve {
namespace {

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr uint8_t kData = 0x0, kHeaders = 0x1, kSettings = 0x4, kContinuation = 0x9;
constexpr uint8_t kEndHeaders = 0x4;

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, size_t length) {
  std::string frame = {static_cast<char>(length >> 16), static_cast<char>(length >> 8),
                       static_cast<char>(length),       static_cast<char>(type),
                       static_cast<char>(flags),        static_cast<char>(stream >> 24),
                       static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                       static_cast<char>(stream)};
  return frame + std::string(length, 'h');
}

H2Rules Rules(int64_t block) {
  H2Rules rules;
  rules.max_header_block_bytes = block;
  return rules;
}

using Clock = std::chrono::steady_clock;

// The whole stream in one call, and again a byte at a time, at one time:
// the same answer.
absl::Status Check(const std::string& stream, const H2Rules& rules) {
  const Clock::time_point now = Clock::now();
  H2FrameCheck whole(rules);
  const absl::Status at_once = whole.Consume(stream, now);
  H2FrameCheck bytewise(rules);
  absl::Status one_by_one;
  for (char c : stream) {
    one_by_one = bytewise.Consume(std::string(1, c), now);
    if (!one_by_one.ok()) break;
  }
  EXPECT_EQ(at_once, one_by_one);
  EXPECT_EQ(whole.requested(), bytewise.requested());
  return at_once;
}
absl::Status Check(const std::string& stream, int64_t block = 1000) {
  return Check(stream, Rules(block));
}

// Frames of any length pass (gRPC checks them against the size it
// advertised); a block of 9 + 600 + 9 + 382 = 1000 bytes is at the limit.
TEST(H2FrameCheckTest, AcceptsAPrefaceAndWellFormedFrames) {
  const std::string stream = kPreface + Frame(kSettings, 0, 0, 12) + Frame(kHeaders, 0, 1, 600) +
                             Frame(kContinuation, kEndHeaders, 1, 382) +
                             Frame(kData, 0, 1, 100000) + Frame(kHeaders, kEndHeaders, 3, 991) +
                             Frame(kData, 1, 3, 0);
  EXPECT_TRUE(Check(stream).ok()) << Check(stream);
}

TEST(H2FrameCheckTest, RefusesAnythingButTheClientPreface) {
  for (const std::string& start : {std::string("GET / HTTP/1.1\r\n"), std::string("\x16\x03\x01"),
                                   std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r!")}) {
    const absl::Status refused = Check(start);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("client preface"), std::string::npos) << refused;
  }
}

TEST(H2FrameCheckTest, RefusesContinuationOutsideABlockAndOtherFramesInsideOne) {
  EXPECT_NE(Check(kPreface + Frame(kContinuation, kEndHeaders, 1, 10))
                .message()
                .find("a CONTINUATION frame on stream 1 with no header block open"),
            std::string::npos);
  // After END_HEADERS the block is closed.
  EXPECT_FALSE(
      Check(kPreface + Frame(kHeaders, kEndHeaders, 1, 10) + Frame(kContinuation, 0, 1, 10)).ok());
  const absl::Status data_inside =
      Check(kPreface + Frame(kHeaders, 0, 1, 10) + Frame(kData, 0, 1, 10));
  EXPECT_NE(data_inside.message().find("inside the header block of stream 1"), std::string::npos)
      << data_inside;
  EXPECT_FALSE(Check(kPreface + Frame(kHeaders, 0, 1, 10) + Frame(kContinuation, 0, 3, 10)).ok());
}

TEST(H2FrameCheckTest, BoundsEachHeaderBlockAcrossItsContinuations) {
  // 509 + 309 + 182 = 1000 bytes of frames: at the limit.
  const std::string at_limit = Frame(kHeaders, 0, 1, 500) + Frame(kContinuation, 0, 1, 300) +
                               Frame(kContinuation, kEndHeaders, 1, 173);
  EXPECT_TRUE(Check(kPreface + at_limit + at_limit).ok());  // each block counts afresh
  const absl::Status over =
      Check(kPreface + Frame(kHeaders, 0, 1, 500) + Frame(kContinuation, 0, 1, 300) +
            Frame(kContinuation, 0, 1, 174));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("a header block of over 1000 bytes on stream 1"), std::string::npos)
      << over;
  // An endless block of empty CONTINUATION frames is refused too: each
  // counts its 9-byte header.
  std::string endless = kPreface + Frame(kHeaders, 0, 1, 0);
  for (int i = 0; i < 111; ++i) endless += Frame(kContinuation, 0, 1, 0);
  EXPECT_FALSE(Check(endless).ok());
  EXPECT_TRUE(Check(endless.substr(0, kPreface.size() + 9 * 111)).ok());  // 999 bytes
}

TEST(H2FrameCheckTest, AnErrorSticks) {
  H2FrameCheck check(Rules(1000));
  EXPECT_FALSE(check.Consume("GET", Clock::now()).ok());
  EXPECT_FALSE(check.Consume(kPreface, Clock::now()).ok());
}

constexpr uint8_t kPriority = 0x2, kRstStream = 0x3, kPing = 0x6, kWindowUpdate = 0x8;
constexpr uint8_t kEndStream = 0x1, kPadded = 0x8;

H2Rules ControlRules(int64_t burst, int64_t per_second, int64_t per_frame_sent = 4) {
  H2Rules rules = Rules(1000);
  rules.control_frame_burst = burst;
  rules.control_frames_per_second = per_second;
  rules.control_frames_per_frame_sent = per_frame_sent;
  return rules;
}

std::string Frames(uint8_t type, uint8_t flags, uint32_t stream, size_t length, int count) {
  std::string frames;
  for (int i = 0; i < count; ++i) frames += Frame(type, flags, stream, length);
  return frames;
}

// Ten control frames of any kind pass a burst of ten; one more is a flood.
TEST(H2FrameCheckTest, ControlFramesPastTheBurstAreAFlood) {
  const H2Rules rules = ControlRules(10, 5);
  for (const uint8_t type :
       {kPing, kSettings, kRstStream, kWindowUpdate, kPriority, uint8_t{0x42}}) {
    const std::string ten = kPreface + Frames(type, 0, type == kPing || type == kSettings ? 0 : 1,
                                              type == kPing ? 8 : 4, 10);
    EXPECT_TRUE(Check(ten, rules).ok()) << int{type};
    const absl::Status flood = Check(ten + Frame(type, 0, 1, 4), rules);
    EXPECT_EQ(flood.code(), absl::StatusCode::kResourceExhausted) << int{type};
    EXPECT_NE(flood.message().find("a flood of control frames"), std::string::npos) << flood;
    EXPECT_NE(flood.message().find("over 10 at once, or over 5 a second"), std::string::npos)
        << flood;
  }
  // PING ACKs too, and one kind with another.
  EXPECT_FALSE(
      Check(kPreface + Frames(kPing, 1, 0, 8, 6) + Frames(kWindowUpdate, 0, 0, 4, 5), rules).ok());
}

// Data, and the empty DATA frame that ends a stream, are not control
// frames; an empty DATA frame that does not end its stream is, and so is a
// padded one with nothing but padding. Header blocks are not.
TEST(H2FrameCheckTest, EmptyDataCountsAsControlButDataAndEndsOfStreamDoNot) {
  const H2Rules rules = ControlRules(2, 0);
  const std::string two = kPreface + Frame(kData, 0, 1, 0) + Frame(kPing, 0, 0, 8);
  EXPECT_TRUE(Check(two + Frames(kData, 0, 1, 100, 20) + Frames(kData, kEndStream, 1, 0, 20) +
                        Frames(kHeaders, kEndHeaders, 3, 10, 20),
                    rules)
                  .ok());
  EXPECT_FALSE(Check(two + Frame(kData, 0, 1, 0), rules).ok());
  // Padded: a pad length byte of 4 and 4 bytes of padding is empty; with 1
  // byte of data it is not; ending the stream it is not counted either.
  const std::string padding_only = Frame(kData, kPadded, 1, 5).replace(9, 1, 1, '\x04');
  const std::string one_byte = Frame(kData, kPadded, 1, 6).replace(9, 1, 1, '\x04');
  const std::string padded_end = Frame(kData, kPadded | kEndStream, 1, 5).replace(9, 1, 1, '\x04');
  EXPECT_TRUE(Check(two + one_byte + one_byte + padded_end, rules).ok());
  EXPECT_FALSE(Check(two + one_byte + padding_only, rules).ok());
}

// The bucket gains control_frames_per_second, up to the burst, and
// control_frames_per_frame_sent for each DATA or HEADERS frame sent to the
// client, one for each PING or SETTINGS, nothing for the server's ACKs.
TEST(H2FrameCheckTest, TheBucketFillsWithTimeAndWithFramesSent) {
  const Clock::time_point start = Clock::now();
  {
    H2FrameCheck check(ControlRules(10, 5));
    EXPECT_TRUE(check.Consume(kPreface + Frames(kPing, 0, 0, 8, 10), start).ok());
    // Half a second later: 2.5 frames more, so two pass and the third does not.
    const Clock::time_point later = start + std::chrono::milliseconds(500);
    EXPECT_TRUE(check.Consume(Frames(kPing, 0, 0, 8, 2), later).ok());
    EXPECT_FALSE(check.Consume(Frame(kPing, 0, 0, 8), later).ok());
  }
  {
    H2FrameCheck check(ControlRules(10, 5));
    EXPECT_TRUE(check.Consume(kPreface + Frames(kPing, 0, 0, 8, 10), start).ok());
    // An hour later the bucket is full again, not fuller.
    const Clock::time_point hour = start + std::chrono::hours(1);
    EXPECT_TRUE(check.Consume(Frames(kPing, 0, 0, 8, 10), hour).ok());
    EXPECT_FALSE(check.Consume(Frame(kPing, 0, 0, 8), hour).ok());
  }
  {
    // Two frames earned per DATA or HEADERS frame sent, one per PING or
    // SETTINGS, none for ACKs or other frames: the server's SETTINGS (cut
    // in two sends), a DATA frame of 100 bytes (its bytes earn nothing), a
    // PING ACK, a SETTINGS ACK, a RST_STREAM, a HEADERS and a PING earn six.
    H2FrameCheck check(ControlRules(10, 0, 2));
    EXPECT_TRUE(check.Consume(kPreface + Frames(kWindowUpdate, 0, 0, 4, 10), start).ok());
    const std::string settings = Frame(kSettings, 0, 0, 12);
    check.Sent(settings.substr(0, 5));
    check.Sent(settings.substr(5) + Frame(kData, 0, 1, 100).substr(0, 50));
    check.Sent(Frame(kData, 0, 1, 100).substr(50) + Frame(kPing, 1, 0, 8) +
               Frame(kSettings, 1, 0, 0) + Frame(kRstStream, 0, 1, 4));
    check.Sent(Frame(kHeaders, kEndHeaders, 1, 30) + Frame(kPing, 0, 0, 8));
    EXPECT_TRUE(check.Consume(Frames(kWindowUpdate, 0, 1, 4, 6), start).ok());
    EXPECT_FALSE(check.Consume(Frame(kWindowUpdate, 0, 1, 4), start).ok());
  }
  {
    H2FrameCheck check(ControlRules(4, 0, 2));
    check.Sent(Frames(kData, 0, 1, 10, 1000));  // no more than the burst
    EXPECT_TRUE(check.Consume(kPreface + Frames(kPing, 0, 0, 8, 4), start).ok());
    EXPECT_FALSE(check.Consume(Frame(kPing, 0, 0, 8), start).ok());
  }
}

// A request is a whole HEADERS block; a preface, settings, pings or a
// block not yet ended are not, nor a PUSH_PROMISE (which no client sends).
TEST(H2FrameCheckTest, ARequestIsAWholeHeadersBlock) {
  const Clock::time_point now = Clock::now();
  H2FrameCheck check(Rules(1000));
  ASSERT_TRUE(
      check.Consume(kPreface + Frame(kSettings, 0, 0, 6) + Frame(kPing, 0, 0, 8), now).ok());
  EXPECT_FALSE(check.requested());
  ASSERT_TRUE(check.Consume(Frame(0x5, kEndHeaders, 1, 10), now).ok());
  EXPECT_FALSE(check.requested());
  ASSERT_TRUE(check.Consume(Frame(kHeaders, 0, 1, 10), now).ok());
  EXPECT_FALSE(check.requested());
  ASSERT_TRUE(check.Consume(Frame(kContinuation, kEndHeaders, 1, 10), now).ok());
  EXPECT_TRUE(check.requested());
}

// receive_buffer > 0: SO_RCVBUF, set before connecting so the window is
// small. `from`: the local address (any of 127.0.0.0/8 is loopback's).
int Connect(int port, int receive_buffer = 0, const char* from = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (receive_buffer > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  }
  if (from != nullptr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, from, &local.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) {
      close(fd);
      return -1;
    }
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes (or fails, or `limit` bytes came).
std::string ReadAll(int fd, size_t limit = SIZE_MAX) {
  std::string out;
  char buffer[65536];
  while (out.size() < limit) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// In gRPC's place: each handed-off socket is echoed back by a thread of its
// own, which records when its peer (the guard) closed it.
class EchoPeers {
 public:
  ~EchoPeers() {
    for (std::thread& t : threads_) t.join();
  }
  H2Guard::Handoff Handoff() {
    return [this](int fd) {
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(fd);
      handed_off_.fetch_add(1);
      threads_.emplace_back([this, fd] {
        // Blocking, for a plain loop.
        const int flags = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        char buffer[8192];
        ssize_t n;
        while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
          if (!SendAll(fd, std::string(buffer, static_cast<size_t>(n)))) break;
        }
        close(fd);
        closed_.fetch_add(1);
      });
    };
  }
  int handed_off() const { return handed_off_.load(); }
  // The descriptor the i-th handed-off connection came on.
  int fd(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return fds_.at(i);
  }
  int closed() const { return closed_.load(); }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::vector<int> fds_;
  std::atomic<int> handed_off_{0}, closed_{0};
};

// What a guard reported cutting, "peer: why", from its thread.
class Cuts {
 public:
  void Add(std::string cut) {
    std::lock_guard<std::mutex> lock(mu_);
    cuts_.push_back(std::move(cut));
  }
  std::vector<std::string> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cuts_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> cuts_;
};

// A guard on a free local port with small buffers (so backpressure is
// exercised), a 4 KiB header-block bound and 300 ms to flush after a close,
// handing connections to echo peers unless a test brings its own.
class H2GuardTest : public ::testing::Test {
 protected:
  void StartGuard() { StartGuard(peers_.Handoff()); }
  void StartGuard(H2Guard::Handoff handoff, H2GuardOptions options = {}) {
    options.flush_after_close = std::chrono::milliseconds(300);
    options.rules.max_header_block_bytes = 4096;
    options.buffer_bytes = 4096;
    options.on_cut = [this](const std::string& peer, const absl::Status& why) {
      cuts_.Add(peer + ": " + std::string(why.message()));
    };
    auto guard = H2Guard::Listen("127.0.0.1", 0, "the test port", std::move(options));
    ASSERT_TRUE(guard.ok()) << guard.status();
    ASSERT_TRUE((*guard)->Start(std::move(handoff)).ok());
    guard_ = std::move(*guard);
  }

  EchoPeers peers_;  // outlives the guard, which hands it connections
  Cuts cuts_;
  std::unique_ptr<H2Guard> guard_;
};

template <typename Pred>
bool WaitFor(Pred done) {
  for (int i = 0; i < 500 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST_F(H2GuardTest, RelaysBothWaysUnderBackpressure) {
  ASSERT_NO_FATAL_FAILURE(StartGuard());
  const int fd = Connect(guard_->port());
  ASSERT_GE(fd, 0);
  // 8 MiB of DATA frames, a varying byte pattern, sent while the echo is
  // read on another thread: far more than the guard's 4 KiB buffers hold.
  std::string stream = kPreface;
  for (int i = 0; stream.size() < (8u << 20); ++i) {
    std::string frame = Frame(kData, 0, 1, 16384);
    for (size_t j = 9; j < frame.size(); ++j) frame[j] = static_cast<char>(i * 31 + j);
    stream += frame;
  }
  std::string echoed;
  std::thread reader([&] { echoed = ReadAll(fd, stream.size()); });
  EXPECT_TRUE(SendAll(fd, stream));
  reader.join();
  EXPECT_TRUE(echoed == stream) << echoed.size() << " of " << stream.size() << " bytes came back";
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return peers_.closed() == 1; }));
  EXPECT_EQ(guard_->connections_cut(), 0);
  guard_->Stop(std::chrono::milliseconds(0));
}

TEST_F(H2GuardTest, ACutClosesBothSidesAndNamesThePeerAndTheReason) {
  ASSERT_NO_FATAL_FAILURE(StartGuard());
  const int fd = Connect(guard_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, kPreface));
  ASSERT_TRUE(WaitFor([&] { return peers_.handed_off() == 1; }));
  std::string flood = Frame(kHeaders, 0, 1, 1000);
  for (int i = 0; i < 10; ++i) flood += Frame(kContinuation, 0, 1, 1000);
  SendAll(fd, flood);  // may fail part way: the guard closes the connection
  ReadAll(fd);         // ends: the connection is closed
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return peers_.closed() == 1; }));
  EXPECT_EQ(guard_->connections_cut(), 1);
  const std::vector<std::string> cuts = cuts_.Get();
  ASSERT_EQ(cuts.size(), 1u);
  EXPECT_EQ(cuts[0].rfind("127.0.0.1:", 0), 0u) << cuts[0];
  EXPECT_NE(cuts[0].find("a header block of over 4096 bytes on stream 1"), std::string::npos)
      << cuts[0];
}

TEST_F(H2GuardTest, StopAcceptingClosesThePortAndStopClosesWhatIsOpen) {
  ASSERT_NO_FATAL_FAILURE(StartGuard());
  const int open = Connect(guard_->port());
  ASSERT_GE(open, 0);
  ASSERT_TRUE(SendAll(open, kPreface));
  EXPECT_EQ(ReadAll(open, kPreface.size()), kPreface);  // relayed and echoed
  guard_->StopAccepting();
  EXPECT_TRUE(WaitFor([&] { return Connect(guard_->port()) < 0; }));
  EXPECT_EQ(peers_.handed_off(), 1);
  // The open connection still relays until Stop, which closes it.
  ASSERT_TRUE(SendAll(open, Frame(kSettings, 0, 0, 0)));
  EXPECT_EQ(ReadAll(open, 9), Frame(kSettings, 0, 0, 0));
  guard_->Stop(std::chrono::milliseconds(0));
  EXPECT_EQ(ReadAll(open), "");
  close(open);
  EXPECT_TRUE(WaitFor([&] { return peers_.closed() == 1; }));
}

// A peer in gRPC's place that writes until every buffer on the way is full
// and closes, to a client that reads nothing: the guard holds the
// connection for the client to take the rest, and closes it once
// flush_after_close (300 ms here) has passed instead of holding it for ever.
TEST_F(H2GuardTest, AClientThatDoesNotTakeTheLastBytesIsClosedAfterAWhile) {
  std::thread writer;
  std::atomic<size_t> written{0};
  StartGuard([&](int fd) {
    writer = std::thread([fd, &written] {
      const std::string chunk(65536, 'x');
      int idle_ms = 0;
      while (idle_ms < 500) {  // full: nothing more went for half a second
        const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
        if (n > 0) {
          written += static_cast<size_t>(n);
          idle_ms = 0;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          idle_ms += 10;
        }
      }
      close(fd);
    });
  });
  ASSERT_NE(guard_, nullptr);
  const int fd = Connect(guard_->port(), 4096);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, kPreface));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // reads nothing
  writer.join();
  const auto start = std::chrono::steady_clock::now();
  const std::string got = ReadAll(fd);  // what reached this socket, then the close
  EXPECT_LT(got.size(), written.load());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  close(fd);
  EXPECT_EQ(guard_->connections_cut(), 0);
}

// Whether the guard closed `fd` within `timeout` (it reads what the echo
// sends back meanwhile).
bool ClosedWithin(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buffer[4096];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// A request: the preface and a whole HEADERS block.
const std::string kRequest = kPreface + Frame(kHeaders, kEndHeaders, 1, 20);

// 2,000 PINGs cut the connection after the burst (100 here), gRPC's side
// included, and the cut names the flood; pings within the burst pass.
TEST_F(H2GuardTest, APingFloodIsCut) {
  H2GuardOptions options;
  options.rules.control_frame_burst = 100;
  options.rules.control_frames_per_second = 10;
  ASSERT_NO_FATAL_FAILURE(StartGuard(peers_.Handoff(), options));
  const int calm = Connect(guard_->port());
  ASSERT_GE(calm, 0);
  const std::string pings = kPreface + Frames(0x6, 0, 0, 8, 90);
  ASSERT_TRUE(SendAll(calm, pings));
  EXPECT_EQ(ReadAll(calm, pings.size()), pings);  // all relayed and echoed
  const int flood = Connect(guard_->port());
  ASSERT_GE(flood, 0);
  ASSERT_TRUE(SendAll(flood, kPreface));
  ASSERT_TRUE(WaitFor([&] { return peers_.handed_off() == 2; }));
  SendAll(flood, Frames(0x6, 0, 0, 8, 2000));  // may fail part way
  EXPECT_TRUE(ClosedWithin(flood, std::chrono::seconds(5)));
  close(flood);
  EXPECT_TRUE(WaitFor([&] { return peers_.closed() == 1; }));
  EXPECT_EQ(guard_->connections_cut(), 1);
  const std::vector<std::string> cuts = cuts_.Get();
  ASSERT_EQ(cuts.size(), 1u);
  EXPECT_NE(cuts[0].find("a flood of control frames"), std::string::npos) << cuts[0];
  close(calm);
}

// gRPC gets a connection once its client preface has come: ten sockets
// that send nothing, or part of it, cost it nothing, and leaving before the
// rest closes them.
TEST_F(H2GuardTest, ASocketReachesGrpcOnlyOnceItsPrefaceHasCome) {
  ASSERT_NO_FATAL_FAILURE(StartGuard());
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) {
    silent.push_back(Connect(guard_->port()));
    ASSERT_GE(silent.back(), 0);
  }
  ASSERT_TRUE(SendAll(silent[0], kPreface.substr(0, 10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(peers_.handed_off(), 0);
  ASSERT_TRUE(SendAll(silent[0], kPreface.substr(10)));
  EXPECT_EQ(ReadAll(silent[0], kPreface.size()), kPreface);  // relayed and echoed
  EXPECT_EQ(peers_.handed_off(), 1);
  for (int fd : silent) close(fd);
  EXPECT_TRUE(WaitFor([&] { return peers_.closed() == 1; }));
  EXPECT_EQ(peers_.handed_off(), 1);
}

// Three idle connections from 127.0.0.2 and three from 127.0.0.3, with at
// most three per address: a fourth from 127.0.0.2 closes the oldest of
// 127.0.0.2's, and none of 127.0.0.3's.
TEST_F(H2GuardTest, ANewConnectionClosesTheOldestIdleOneOfItsAddress) {
  H2GuardOptions options;
  options.max_unrequested_per_address = 3;
  ASSERT_NO_FATAL_FAILURE(StartGuard(peers_.Handoff(), options));
  std::vector<int> a, b;
  // Each sends the preface (nothing more), so that its handoff says the
  // guard has it.
  const auto open = [&](std::vector<int>& into, const char* from) {
    into.push_back(Connect(guard_->port(), 0, from));
    ASSERT_GE(into.back(), 0);
    ASSERT_TRUE(SendAll(into.back(), kPreface));
    const int want = static_cast<int>(a.size() + b.size());
    ASSERT_TRUE(WaitFor([&] { return peers_.handed_off() == want; }));
  };
  for (int i = 0; i < 3; ++i) {
    ASSERT_NO_FATAL_FAILURE(open(a, "127.0.0.2"));
    ASSERT_NO_FATAL_FAILURE(open(b, "127.0.0.3"));
  }
  ASSERT_NO_FATAL_FAILURE(open(a, "127.0.0.2"));
  EXPECT_TRUE(ClosedWithin(a[0], std::chrono::seconds(5)));
  EXPECT_TRUE(WaitFor([&] { return peers_.closed() == 1; }));  // gRPC's side too
  EXPECT_TRUE(WaitFor([&] { return guard_->connections_reclaimed() == 1; }));
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_FALSE(ClosedWithin(a[i], std::chrono::milliseconds(100))) << i;
  }
  for (int fd : b) EXPECT_FALSE(ClosedWithin(fd, std::chrono::milliseconds(100)));
  EXPECT_EQ(guard_->connections_reclaimed(), 1);
  for (int fd : a) close(fd);
  for (int fd : b) close(fd);
}

// With room for four idle connections: one from 127.0.0.3, the oldest,
// then three from 127.0.0.2; a fifth from 127.0.0.4 closes the oldest of
// 127.0.0.2's, the address with the most, and not 127.0.0.3's.
TEST_F(H2GuardTest, OverTheCapTheAddressWithTheMostIdleConnectionsGivesWay) {
  H2GuardOptions options;
  options.max_unrequested = 4;
  ASSERT_NO_FATAL_FAILURE(StartGuard(peers_.Handoff(), options));
  std::vector<std::pair<int, const char*>> idle;
  for (const char* from : {"127.0.0.3", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.4"}) {
    idle.emplace_back(Connect(guard_->port(), 0, from), from);
    ASSERT_GE(idle.back().first, 0);
    ASSERT_TRUE(SendAll(idle.back().first, kPreface));
    ASSERT_TRUE(WaitFor([&] { return peers_.handed_off() == static_cast<int>(idle.size()); }));
  }
  EXPECT_TRUE(ClosedWithin(idle[1].first, std::chrono::seconds(5)));
  for (size_t i : {0, 2, 3, 4}) {
    EXPECT_FALSE(ClosedWithin(idle[i].first, std::chrono::milliseconds(100))) << idle[i].second;
  }
  EXPECT_EQ(guard_->connections_reclaimed(), 1);
  for (const auto& [fd, from] : idle) close(fd);
}

// With room for four connections, two of them without a request: a
// connection that sent a request keeps its place and relays on while new
// idle ones push out the oldest idle ones, and a guard full with three
// callers and an idle connection takes a fourth caller in the idle one's
// place.
TEST_F(H2GuardTest, IdleConnectionsGiveWayToNewOnesAndRequestsKeepTheirPlace) {
  H2GuardOptions options;
  options.max_connections = 4;
  options.max_unrequested = 2;
  ASSERT_NO_FATAL_FAILURE(StartGuard(peers_.Handoff(), options));
  const int caller = Connect(guard_->port());
  ASSERT_GE(caller, 0);
  ASSERT_TRUE(SendAll(caller, kRequest));
  ASSERT_EQ(ReadAll(caller, kRequest.size()), kRequest);
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    idle.push_back(Connect(guard_->port()));
    ASSERT_GE(idle.back(), 0);
  }
  EXPECT_TRUE(WaitFor([&] { return guard_->connections_reclaimed() == 18; }));
  for (int i = 0; i < 18; ++i) EXPECT_TRUE(ClosedWithin(idle[i], std::chrono::seconds(5))) << i;
  for (int i = 18; i < 20; ++i) EXPECT_FALSE(ClosedWithin(idle[i], std::chrono::milliseconds(100)));
  // The second caller pushes out idle[18] (two idle at most); the third
  // fills the guard; the fourth takes idle[19]'s place.
  std::vector<int> callers = {caller};
  for (int i = 0; i < 3; ++i) {
    callers.push_back(Connect(guard_->port()));
    ASSERT_GE(callers.back(), 0);
    ASSERT_TRUE(SendAll(callers.back(), kRequest));
    ASSERT_EQ(ReadAll(callers.back(), kRequest.size()), kRequest) << i;
  }
  EXPECT_TRUE(ClosedWithin(idle[18], std::chrono::seconds(5)));
  EXPECT_TRUE(ClosedWithin(idle[19], std::chrono::seconds(5)));
  const std::string ping = Frame(0x6, 0, 0, 8);
  for (int fd : callers) {
    ASSERT_TRUE(SendAll(fd, ping));
    EXPECT_EQ(ReadAll(fd, ping.size()), ping);
  }
  EXPECT_EQ(guard_->connections_reclaimed(), 20);
  EXPECT_EQ(guard_->connections_cut(), 0);
  for (int fd : idle) close(fd);
  for (int fd : callers) close(fd);
}

// With room for two connections that have authenticated nothing: three
// callers send a request, and gRPC says the first authenticated ("fd:N",
// its peer); a fourth closes the oldest of the other two, not the first.
// Peers that are not the guard's are ignored.
TEST_F(H2GuardTest, AConnectionThatAuthenticatedKeepsItsPlace) {
  H2GuardOptions options;
  options.max_unauthenticated = 2;
  ASSERT_NO_FATAL_FAILURE(StartGuard(peers_.Handoff(), options));
  std::vector<int> callers;
  for (int i = 0; i < 4; ++i) {
    callers.push_back(Connect(guard_->port()));
    ASSERT_GE(callers.back(), 0);
    ASSERT_TRUE(SendAll(callers.back(), kRequest));
    ASSERT_EQ(ReadAll(callers.back(), kRequest.size()), kRequest) << i;
    if (i == 0) {
      guard_->MarkAuthenticated("ipv4:127.0.0.1:1");
      guard_->MarkAuthenticated("fd:x");
      guard_->MarkAuthenticated("fd:" + std::to_string(peers_.fd(0)));
    }
  }
  EXPECT_TRUE(ClosedWithin(callers[1], std::chrono::seconds(5)));
  const std::string ping = Frame(0x6, 0, 0, 8);
  for (int i : {0, 2, 3}) {
    ASSERT_TRUE(SendAll(callers[i], ping));
    EXPECT_EQ(ReadAll(callers[i], ping.size()), ping) << i;
  }
  EXPECT_EQ(guard_->connections_reclaimed(), 1);
  for (int fd : callers) close(fd);
}

// A connection that sends no request within request_timeout (300 ms here)
// is closed, the preface and pings notwithstanding; one that sent a
// request stays.
TEST_F(H2GuardTest, AConnectionWithoutARequestIsClosedAfterTheRequestTimeout) {
  H2GuardOptions options;
  options.request_timeout = std::chrono::milliseconds(300);
  ASSERT_NO_FATAL_FAILURE(StartGuard(peers_.Handoff(), options));
  const int idle = Connect(guard_->port());
  const int caller = Connect(guard_->port());
  ASSERT_GE(idle, 0);
  ASSERT_GE(caller, 0);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(SendAll(idle, kPreface + Frame(0x6, 0, 0, 8)));
  ASSERT_TRUE(SendAll(caller, kRequest));
  EXPECT_TRUE(ClosedWithin(idle, std::chrono::seconds(5)));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(250));
  EXPECT_LT(waited, std::chrono::seconds(2));
  EXPECT_FALSE(ClosedWithin(caller, std::chrono::milliseconds(500)));
  EXPECT_EQ(guard_->connections_reclaimed(), 1);
  close(idle);
  close(caller);
}

}  // namespace
}  // namespace deltaserve
