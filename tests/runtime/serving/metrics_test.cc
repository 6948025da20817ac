// The metrics registry's text exposition output, byte for byte, and the
// HttpServer that serves it, driven by a real client socket on 127.0.0.1:
// good and bad requests, slow and vanishing clients, Stop() and bind errors.
#include "runtime/serving/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/serving/http_server.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// --- Metrics -----------------------------------------------------------------

TEST(MetricsTest, RendersCountersAndGauges) {
  MetricsRegistry registry;
  Counter& requests = registry.AddCounter("deltaserve_requests_total", "Requests served.");
  Gauge& in_flight = registry.AddGauge("deltaserve_requests_in_flight", "Requests running.");
  requests.Add();
  requests.Add(2.5);
  in_flight.Set(3);
  in_flight.Add(-1);
  EXPECT_EQ(requests.value(), 3.5);
  EXPECT_EQ(in_flight.value(), 2);
  EXPECT_EQ(registry.Render(),
            "# HELP deltaserve_requests_total Requests served.\n"
            "# TYPE deltaserve_requests_total counter\n"
            "deltaserve_requests_total 3.5\n"
            "# HELP deltaserve_requests_in_flight Requests running.\n"
            "# TYPE deltaserve_requests_in_flight gauge\n"
            "deltaserve_requests_in_flight 2\n");
}

TEST(MetricsTest, RendersHistogramCumulatively) {
  MetricsRegistry registry;
  Histogram& latency = registry.AddHistogram("step_seconds", "Step latency.", {0.5, 1, 2.5});
  // 0.5 is on a bound: `le` is inclusive. 100 is above all bounds: +Inf only.
  for (double v : {0.25, 0.5, 1.5, 3.0, 100.0}) latency.Observe(v);
  EXPECT_EQ(registry.Render(),
            "# HELP step_seconds Step latency.\n"
            "# TYPE step_seconds histogram\n"
            "step_seconds_bucket{le=\"0.5\"} 2\n"
            "step_seconds_bucket{le=\"1\"} 2\n"
            "step_seconds_bucket{le=\"2.5\"} 3\n"
            "step_seconds_bucket{le=\"+Inf\"} 5\n"
            "step_seconds_sum 105.25\n"
            "step_seconds_count 5\n");
  const Histogram::Snapshot snapshot = latency.Read();
  EXPECT_EQ(snapshot.cumulative, (std::vector<uint64_t>{2, 2, 3, 5}));
  EXPECT_EQ(snapshot.count, 5u);
  EXPECT_EQ(snapshot.sum, 105.25);
}

TEST(MetricsTest, EmptyHistogramAndEmptyRegistry) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.Render(), "");
  registry.AddHistogram("h", "No observations yet.", {1});
  EXPECT_EQ(registry.Render(),
            "# HELP h No observations yet.\n"
            "# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 0\n"
            "h_bucket{le=\"+Inf\"} 0\n"
            "h_sum 0\n"
            "h_count 0\n");
}

TEST(MetricsTest, HistogramBoundsEdgeCases) {
  // A trailing +Inf is the implicit bucket: dropped, not doubled.
  Histogram with_inf({1, 2, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(with_inf.bounds(), (std::vector<double>{1, 2}));
  // No bounds: only +Inf.
  Histogram no_bounds({});
  no_bounds.Observe(7);
  EXPECT_EQ(no_bounds.Read().cumulative, (std::vector<uint64_t>{1}));
  // NaN counts in +Inf only, and makes the sum NaN, as Prometheus clients do.
  Histogram nan({1, 2});
  nan.Observe(std::nan(""));
  EXPECT_EQ(nan.Read().cumulative, (std::vector<uint64_t>{0, 0, 1}));
  EXPECT_TRUE(std::isnan(nan.Read().sum));
  // Below the first bound, and -Inf, go in the first bucket.
  Histogram low({1, 2});
  low.Observe(-5);
  low.Observe(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(low.Read().cumulative, (std::vector<uint64_t>{2, 2, 2}));
}

TEST(MetricsTest, EscapesHelp) {
  MetricsRegistry registry;
  registry.AddGauge("g", "first line\nback\\slash \"quoted\"");
  EXPECT_EQ(registry.Render(),
            "# HELP g first line\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g 0\n");
}

TEST(MetricsTest, FormatsValuesToRoundTrip) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(1), "1");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(0.0025), "0.0025");
  EXPECT_EQ(FormatMetricValue(3600), "3600");
  EXPECT_EQ(FormatMetricValue(-2.5), "-2.5");
  EXPECT_EQ(FormatMetricValue(1e20), "1e+20");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<uint64_t> bits;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t b = bits(rng);
    double v;
    std::memcpy(&v, &b, sizeof(v));
    if (!std::isfinite(v)) continue;
    const std::string text = FormatMetricValue(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
}

TEST(MetricsTest, ValidatesNames) {
  for (const char* good : {"a", "_a", "a:b", "deltaserve_ttft_seconds", "A9_:x", "_"}) {
    EXPECT_TRUE(IsValidMetricName(good)) << good;
  }
  for (const char* bad : {"", "9a", "a-b", "a b", "a.b", "__reserved", "é", "a{}"}) {
    EXPECT_FALSE(IsValidMetricName(bad)) << bad;
  }
}

TEST(MetricsTest, LatencyBucketsSpanMillisecondsToAnHour) {
  const std::vector<double> buckets = LatencyBuckets();
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front(), 0.001);
  EXPECT_GE(buckets.back(), 3600);
  for (size_t i = 1; i < buckets.size(); ++i) EXPECT_LT(buckets[i - 1], buckets[i]);
  Histogram histogram(buckets);  // accepted as bounds
  EXPECT_EQ(histogram.bounds(), buckets);
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry registry;
  Histogram& histogram = registry.AddHistogram("h", "help", {1, 10});
  Counter& counter = registry.AddCounter("c", "help");
  Gauge& gauge = registry.AddGauge("g", "help");
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  // A scraper rendering throughout: +Inf and _count must agree in each render.
  std::thread scraper([&] {
    while (!done.load()) {
      const Histogram::Snapshot snapshot = histogram.Read();
      ASSERT_EQ(snapshot.cumulative.back(), snapshot.count);
      registry.Render();
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        histogram.Observe((i + t) % 2 == 0 ? 0.5 : 5);  // integers sum exactly
        counter.Add(2);
        gauge.Add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done = true;
  scraper.join();
  const Histogram::Snapshot snapshot = histogram.Read();
  constexpr uint64_t kTotal = uint64_t{kThreads} * kPerThread;
  EXPECT_EQ(snapshot.count, kTotal);
  EXPECT_EQ(snapshot.cumulative, (std::vector<uint64_t>{kTotal / 2, kTotal, kTotal}));
  EXPECT_EQ(snapshot.sum, (0.5 + 5) * (kTotal / 2));
  EXPECT_EQ(counter.value(), 2.0 * kTotal);
  EXPECT_EQ(gauge.value(), static_cast<double>(kTotal));
}

TEST(MetricsDeathTest, ProgrammerErrorsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddCounter("bad-name", "help");
      },
      "invalid metric name \"bad-name\"");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddCounter("x", "help");
        registry.AddGauge("x", "help");
      },
      "\"x\" is already registered");
  // A histogram's series names are taken too.
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddHistogram("lat", "help", {1});
        registry.AddCounter("lat_count", "help");
      },
      "\"lat_count\" is already registered");
  EXPECT_DEATH(
      {
        MetricsRegistry registry;
        registry.AddGauge("lat_sum", "help");
        registry.AddHistogram("lat", "help", {1});
      },
      "\"lat_sum\" is already registered");
  EXPECT_DEATH(Histogram({2, 1}), "histogram bound 1");
  EXPECT_DEATH(Histogram({1, std::nan("")}), "histogram bound 1");
  EXPECT_DEATH(Counter().Add(-1), "must be >= 0");
}

// --- HttpServer --------------------------------------------------------------

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    ADD_FAILURE() << "connect to port " << port << ": " << std::strerror(errno);
  }
  // A test must fail, not hang, if the server never answers.
  timeval timeout = {10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  return fd;
}

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GT(n, 0) << std::strerror(errno);
    sent += static_cast<size_t>(n);
  }
}

// Everything until the server closes (or the 10 s receive timeout).
std::string ReadAll(int fd) {
  std::string out;
  char chunk[65536];
  while (true) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ADD_FAILURE() << "recv: " << std::strerror(errno);
    if (n <= 0) break;
    out.append(chunk, static_cast<size_t>(n));
  }
  return out;
}

std::string Exchange(int port, const std::string& request) {
  const int fd = Connect(port);
  SendAll(fd, request);
  std::string response = ReadAll(fd);
  ::close(fd);
  return response;
}

struct ParsedResponse {
  int status = 0;
  std::string status_line;
  std::map<std::string, std::string> headers;
  std::string body;
};

ParsedResponse Parse(const std::string& response) {
  ParsedResponse parsed;
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    ADD_FAILURE() << "no complete response head in: " << response;
    return parsed;
  }
  parsed.body = response.substr(head_end + 4);
  size_t pos = response.find("\r\n");
  parsed.status_line = response.substr(0, pos);
  parsed.status = std::atoi(parsed.status_line.substr(9, 3).c_str());
  while (pos < head_end) {
    const size_t next = response.find("\r\n", pos + 2);
    const std::string line = response.substr(pos + 2, next - pos - 2);
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) parsed.headers[line.substr(0, colon)] = line.substr(colon + 2);
    pos = next;
  }
  return parsed;
}

// A server for /metrics (the registry's text) that answers 404 elsewhere,
// and records what it was asked.
class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(const HttpServerOptions& options = {}) {
    registry_.AddCounter("scrapes_total", "Scrapes.").Add(7);
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
        "127.0.0.1", 0,
        [this](const HttpRequest& request) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            requests_.push_back(request);
          }
          HttpResponse response;
          if (request.path == "/boom") throw std::runtime_error("handler bug");
          if (request.path == "/big") {
            response.body = std::string(8 << 20, 'x');
          } else if (request.path == "/metrics") {
            response.body = registry_.Render();
          } else {
            response.status = 404;
            response.body = "not found\n";
          }
          return response;
        },
        options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value();
    ASSERT_GT(server_->port(), 0);
  }

  std::vector<HttpRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  MetricsRegistry registry_;
  std::mutex mu_;
  std::vector<HttpRequest> requests_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, ServesMetrics) {
  StartServer();
  const ParsedResponse response = Parse(
      Exchange(server_->port(), "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"));
  EXPECT_EQ(response.status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(response.headers.at("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response.headers.at("Connection"), "close");
  EXPECT_EQ(response.body, registry_.Render());
  EXPECT_EQ(response.headers.at("Content-Length"), std::to_string(response.body.size()));
  ASSERT_EQ(requests().size(), 1u);
  EXPECT_EQ(requests()[0].method, "GET");
  EXPECT_EQ(requests()[0].path, "/metrics");
  EXPECT_EQ(requests()[0].query, "");
}

TEST_F(HttpServerTest, PassesPathQueryAndOtherPathsToHandler) {
  StartServer();
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /metrics?name[]=x HTTP/1.0\r\n\r\n")).status, 200);
  const ParsedResponse not_found = Parse(Exchange(server_->port(), "GET /nope HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(not_found.status_line, "HTTP/1.1 404 Not Found");
  EXPECT_EQ(not_found.body, "not found\n");
  ASSERT_EQ(requests().size(), 2u);
  EXPECT_EQ(requests()[0].path, "/metrics");
  EXPECT_EQ(requests()[0].query, "name[]=x");
  EXPECT_EQ(requests()[1].path, "/nope");
}

TEST_F(HttpServerTest, HeadSendsNoBody) {
  StartServer();
  const ParsedResponse response =
      Parse(Exchange(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "");
  EXPECT_EQ(response.headers.at("Content-Length"), std::to_string(registry_.Render().size()));
}

TEST_F(HttpServerTest, AcceptsSplitRequestsAndBareLineFeeds) {
  StartServer();
  const int fd = Connect(server_->port());
  for (const char* piece : {"GET /met", "rics HTTP/1.1\r", "\nHost: x\r\n", "\r\n"}) {
    SendAll(fd, piece);
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(Parse(ReadAll(fd)).status, 200);
  ::close(fd);
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /metrics HTTP/1.1\nHost: x\n\n")).status, 200);
}

TEST_F(HttpServerTest, RejectsMalformedRequests) {
  StartServer();
  for (const char* request :
       {"GARBAGE\r\n\r\n", "GET /metrics\r\n\r\n", "GET  /metrics HTTP/1.1\r\n\r\n",
        "GET metrics HTTP/1.1\r\n\r\n", "GET /metrics HTTP/1.1 extra\r\n\r\n",
        "GET /metrics FTP/1.1\r\n\r\n", "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n folded: header\r\n\r\n", "G(T /metrics HTTP/1.1\r\n\r\n",
        "\r\n\r\n"}) {
    ParsedResponse response = Parse(Exchange(server_->port(), request));
    EXPECT_EQ(response.status_line, "HTTP/1.1 400 Bad Request") << request;
    EXPECT_EQ(response.headers["Connection"], "close");
  }
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /metrics HTTP/2.0\r\n\r\n")).status, 505);
  // Cut short: the client closes its side before the blank line.
  const int fd = Connect(server_->port());
  SendAll(fd, "GET /metrics HTTP/1.1\r\n");
  ::shutdown(fd, SHUT_WR);
  EXPECT_EQ(Parse(ReadAll(fd)).status, 400);
  ::close(fd);
  EXPECT_TRUE(requests().empty());
}

TEST_F(HttpServerTest, RejectsOtherMethods) {
  StartServer();
  for (const char* request : {"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                              "DELETE /metrics HTTP/1.1\r\n\r\n", "BREW /pot HTTP/1.1\r\n\r\n"}) {
    ParsedResponse response = Parse(Exchange(server_->port(), request));
    EXPECT_EQ(response.status_line, "HTTP/1.1 405 Method Not Allowed") << request;
    EXPECT_EQ(response.headers["Allow"], "GET, HEAD");
  }
  EXPECT_TRUE(requests().empty());
}

TEST_F(HttpServerTest, RejectsOversizedHeads) {
  HttpServerOptions options;
  options.max_request_head_bytes = 8192;
  StartServer(options);
  const std::string padding(10000, 'a');
  // Complete but too long, and never ending: both 431, no handler call.
  for (const std::string& request : {"GET /metrics HTTP/1.1\r\nX-Pad: " + padding + "\r\n\r\n",
                                     "GET /metrics HTTP/1.1\r\nX-Pad: " + padding}) {
    EXPECT_EQ(Parse(Exchange(server_->port(), request)).status, 431);
  }
  // Just under the limit is fine.
  std::string request = "GET /metrics HTTP/1.1\r\nX-Pad: ";
  request += std::string(8192 - request.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(request.size(), 8192u);
  EXPECT_EQ(Parse(Exchange(server_->port(), request)).status, 200);
  EXPECT_EQ(requests().size(), 1u);
}

TEST_F(HttpServerTest, SilentClientsDoNotBlockOthers) {
  HttpServerOptions options;
  options.io_timeout = milliseconds(500);
  StartServer(options);
  std::vector<int> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(Connect(server_->port()));
  SendAll(silent[0], "GET /metr");  // and then nothing more
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n")).status, 200);
  EXPECT_LT(Since(start), milliseconds(400));
  // The silent ones are dropped once the timeout passes: EOF, no answer.
  for (int fd : silent) {
    EXPECT_EQ(ReadAll(fd), "");
    ::close(fd);
  }
  EXPECT_GE(Since(start), milliseconds(400));
  EXPECT_LT(Since(start), milliseconds(3000));
}

TEST_F(HttpServerTest, ConnectionLimitOnlyDelaysUntilTimeout) {
  HttpServerOptions options;
  options.io_timeout = milliseconds(300);
  options.max_connections = 2;
  StartServer(options);
  const int silent1 = Connect(server_->port());
  const int silent2 = Connect(server_->port());
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n")).status, 200);
  EXPECT_LT(Since(start), milliseconds(2000));
  ::close(silent1);
  ::close(silent2);
}

TEST_F(HttpServerTest, SurvivesBadClientsAndHandlerErrors) {
  StartServer();
  // Handler throws: 500, and the server goes on.
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /boom HTTP/1.1\r\n\r\n")).status, 500);
  // A client that resets mid-request.
  {
    const int fd = Connect(server_->port());
    SendAll(fd, "GET /metr");
    const linger reset = {1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    ::close(fd);
  }
  // Clients that ask for 8 MiB and leave without reading: the server's send
  // fails with EPIPE or ECONNRESET, which must not be a SIGPIPE that kills
  // this process.
  for (int i = 0; i < 3; ++i) {
    const int fd = Connect(server_->port());
    SendAll(fd, "GET /big HTTP/1.1\r\n\r\n");
    std::this_thread::sleep_for(milliseconds(20));
    const linger reset = {1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    ::close(fd);
  }
  // A client that reads it all gets all of it.
  const ParsedResponse big = Parse(Exchange(server_->port(), "GET /big HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(big.status, 200);
  EXPECT_EQ(big.body.size(), size_t{8 << 20});
  EXPECT_EQ(Parse(Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n")).status, 200);
}

TEST_F(HttpServerTest, StopIsPromptWithClientsConnected) {
  StartServer();  // default 5 s timeout, which Stop() must not wait out
  const int silent = Connect(server_->port());
  const int port = server_->port();
  EXPECT_EQ(Parse(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n")).status, 200);
  const Clock::time_point start = Clock::now();
  server_->Stop();
  EXPECT_LT(Since(start), milliseconds(500));
  server_->Stop();                 // idempotent
  EXPECT_EQ(ReadAll(silent), "");  // closed by Stop()
  ::close(silent);
  // Nothing listens any more.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
  server_.reset();  // destructor after Stop() is fine
}

TEST(HttpServerStartTest, PortInUseIsAClearError) {
  auto handler = [](const HttpRequest&) { return HttpResponse(); };
  absl::StatusOr<std::unique_ptr<HttpServer>> first = HttpServer::Start("127.0.0.1", 0, handler);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  absl::StatusOr<std::unique_ptr<HttpServer>> second =
      HttpServer::Start("127.0.0.1", port, handler);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(second.status().message());
  EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(EADDRINUSE)), std::string::npos) << message;
  // Once the first is gone the port can be had again (SO_REUSEADDR).
  first->reset();
  EXPECT_TRUE(HttpServer::Start("127.0.0.1", port, handler).ok());
}

TEST(HttpServerStartTest, RejectsBadArguments) {
  auto handler = [](const HttpRequest&) { return HttpResponse(); };
  EXPECT_EQ(HttpServer::Start("127.0.0.1", -1, handler).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("127.0.0.1", 65536, handler).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Start("127.0.0.1", 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  HttpServerOptions options;
  options.io_timeout = milliseconds(0);
  EXPECT_EQ(HttpServer::Start("127.0.0.1", 0, handler, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltaserve
