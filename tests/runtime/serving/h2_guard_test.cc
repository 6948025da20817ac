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
#include <mutex>
#include <string>
#include <thread>
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

// The whole stream in one call, and again a byte at a time: the same answer.
absl::Status Check(const std::string& stream, int64_t block = 1000) {
  H2FrameCheck whole(Rules(block));
  const absl::Status at_once = whole.Consume(stream);
  H2FrameCheck bytewise(Rules(block));
  absl::Status one_by_one;
  for (char c : stream) {
    one_by_one = bytewise.Consume(std::string(1, c));
    if (!one_by_one.ok()) break;
  }
  EXPECT_EQ(at_once, one_by_one);
  return at_once;
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
  EXPECT_FALSE(check.Consume("GET").ok());
  EXPECT_FALSE(check.Consume(kPreface).ok());
}

// receive_buffer > 0: SO_RCVBUF, set before connecting so the window is small.
int Connect(int port, int receive_buffer = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (receive_buffer > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
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
      handed_off_.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu_);
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
  int closed() const { return closed_.load(); }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
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
  void StartGuard(H2Guard::Handoff handoff) {
    H2GuardOptions options;
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
  std::string flood = kPreface + Frame(kHeaders, 0, 1, 1000);
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

}  // namespace
}  // namespace deltaserve
