// The OpenAI HTTP API end to end: `deltaserve serve --http-port 0`, driven
// by the `openai` Python package (deploy/setup.sh --test installs it), curl
// and raw sockets; tokens compared with `deltaserve generate`.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/serving/grpc_request.h"
#include "runtime/tokenizer/chat_format.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

const std::string kModel = "k3-tiny";

std::string Deltaserve(const std::string& args) {
  std::string output;
  EXPECT_EQ(testing::RunCommand(testing::BinPath("deltaserve") + " " + args, &output), 0) << output;
  return output;
}

// A token file the server takes as --client-tokens-file (mode 600).
std::string TokenFile(const std::string& token) {
  const std::string path = testing::TempDir("http_tokens") + "/tokens";
  std::ofstream(path) << "tester:" << token << "\n";
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return path;
}

// The ids of an output's first line ("1 2 3").
std::vector<int32_t> Ids(const std::string& output) {
  std::vector<int32_t> ids;
  const std::string line = output.substr(0, output.find('\n'));
  for (absl::string_view part : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    ids.push_back(std::stoi(std::string(part)));
  }
  return ids;
}

// One HTTP exchange on a raw socket: what the server sent back before it
// closed the connection (or within `wait`).
std::string RawExchange(int port, const std::string& bytes, int wait_ms = 5000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{wait_ms / 1000, (wait_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

TEST(HttpApiTest, OpenAiClientGetsTheTokensOfGenerate) {
  const std::string token = "test-token-0123456789abcdef";
  const std::string model_dir = testing::GoldenPath("model/" + kModel);
  auto server = testing::StartServer("serve --model " + model_dir +
                                     " --http-port 0 --client-tokens-file " + TokenFile(token));
  ASSERT_GE(server.http_port, 0);
  const std::vector<int32_t> prompt = testing::RandomTokens(29, 5);
  const std::string prompt_flag = absl::StrJoin(prompt, ",");
  constexpr int kMaxTokens = 12;
  const std::string generate = "generate --model " + model_dir + " --tokens " + prompt_flag +
                               " --max-tokens " + std::to_string(kMaxTokens) + " --ids";
  const std::vector<int32_t> greedy = Ids(Deltaserve(generate + " 2>/dev/null"));
  const std::vector<int32_t> seeded =
      Ids(Deltaserve(generate + " --temperature 0.8 --top-k 40 --top-p 0.9 --seed 11 2>/dev/null"));
  ASSERT_EQ(greedy.size(), static_cast<size_t>(kMaxTokens));

  std::string output;
  const int code = testing::RunCommand(
      absl::StrCat("PYTHONPATH=", DELTASERVE_PYTHON_DEPS, " ", testing::kSystemPython, " ",
                   DELTASERVE_SOURCE_DIR, "/tests/runtime/serving/openai_client_check.py ",
                   "http://127.0.0.1:", server.http_port, "/v1 ", token, " ", kModel, " ",
                   prompt_flag, " ", kMaxTokens, " 2>&1"),
      &output);
  ASSERT_EQ(code, 0) << output << "\n(the openai package comes from deploy/setup.sh --test)";
  const json r = json::parse(output, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << output;
  EXPECT_EQ(r["models"], json::array({kModel}));
  for (const char* name : {"greedy", "greedy_stream"}) {
    EXPECT_EQ(r[name]["ids"].get<std::vector<int32_t>>(), greedy) << name;
    EXPECT_EQ(r[name]["finish_reason"], "length") << name;
  }
  for (const char* name : {"seeded", "seeded_stream"}) {
    EXPECT_EQ(r[name]["ids"].get<std::vector<int32_t>>(), seeded) << name;
  }
  // The stream's text is the whole response's, and so is its usage.
  EXPECT_EQ(r["greedy_stream"]["text"], r["greedy"]["text"]);
  EXPECT_EQ(r["greedy"]["usage"], json::array({29, kMaxTokens, 29 + kMaxTokens}));
  EXPECT_EQ(r["greedy_stream"]["usage"], json::array({29, kMaxTokens}));
  EXPECT_EQ(r["greedy"]["object"], "text_completion");
  // Four streams at once, each the prompt rotated by its index, each with
  // the tokens generate gives it alone.
  ASSERT_EQ(r["concurrent"].size(), 4u) << output;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> rotated(prompt.begin() + i, prompt.end());
    rotated.insert(rotated.end(), prompt.begin(), prompt.begin() + i);
    const std::vector<int32_t> alone = Ids(
        Deltaserve("generate --model " + model_dir + " --tokens " + absl::StrJoin(rotated, ",") +
                   " --max-tokens " + std::to_string(kMaxTokens) + " --ids 2>/dev/null"));
    EXPECT_EQ(r["concurrent"][i].get<std::vector<int32_t>>(), alone) << i;
  }
  EXPECT_EQ(r["greedy"]["top"], json(std::vector<int>(kMaxTokens, 2)));
  // A prompt of 145 tokens, twice: the second finds its first 128 cached.
  EXPECT_EQ(r["cached_tokens"], json::array({0, 128})) << output;

  // The errors, with OpenAI's statuses and the validator's wording, which
  // the gRPC API gives for the same input.
  const json& e = r["errors"];
  EXPECT_EQ(e["temperature"]["status"], 400);
  EXPECT_EQ(e["temperature"]["param"], "temperature");
  EXPECT_EQ(e["temperature"]["type"], "invalid_request_error");
  EXPECT_EQ(e["n"]["status"], 400);
  EXPECT_EQ(e["n"]["param"], "n");
  EXPECT_EQ(e["vocabulary"]["status"], 400);
  EXPECT_EQ(e["vocabulary"]["param"], "prompt[1]");
  EXPECT_EQ(e["model"]["status"], 404);
  EXPECT_EQ(e["unknown"]["status"], 400);
  EXPECT_EQ(e["unknown"]["param"], "bogus");
  v1::GenerateRequest bad = testing::TokensRequest(prompt, 2);
  bad.mutable_sampling()->set_temperature(-1);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + token);
  v1::GenerateResponse unused;
  auto reader = server.stub->Generate(&context, bad);
  while (reader->Read(&unused)) {
  }
  const grpc::Status refused = reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), e["temperature"]["message"].get<std::string>());

  // Without the API key: 401 before the body is read, with the challenge.
  const std::string unauthorized =
      RawExchange(server.http_port,
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n");
  EXPECT_EQ(unauthorized.rfind("HTTP/1.1 401", 0), 0u) << unauthorized;
  EXPECT_NE(unauthorized.find("WWW-Authenticate: Bearer"), std::string::npos) << unauthorized;
  EXPECT_NE(unauthorized.find("authentication_error"), std::string::npos) << unauthorized;
  // /health needs no key.
  const std::string health =
      RawExchange(server.http_port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
}

TEST(HttpApiTest, CurlStreamsServerSentEventsAndADisconnectCancels) {
  const std::string model_dir = testing::GoldenPath("model/" + kModel);
  auto server = testing::StartServer("serve --model " + model_dir + " --http-port 0");
  ASSERT_GE(server.http_port, 0);
  const std::string url = absl::StrCat("http://127.0.0.1:", server.http_port, "/v1/completions");
  std::string out;
  ASSERT_EQ(
      testing::RunCommand("curl -sN " + url +
                              " -H 'Content-Type: application/json' -d '{\"model\": \"" + kModel +
                              "\", \"prompt\": [1, 2, 3], \"max_tokens\": 5, \"temperature\": 0, "
                              "\"stream\": true, \"stream_options\": {\"include_usage\": true}}'",
                          &out),
      0)
      << out;
  // Five events of text (a token each, or fewer when one holds back part of
  // a character), the finish, the usage, then [DONE]; each `data: ` and a
  // blank line.
  std::vector<std::string> events = absl::StrSplit(out, "\n\n", absl::SkipEmpty());
  ASSERT_GE(events.size(), 4u) << out;
  EXPECT_EQ(events.back(), "data: [DONE]") << out;
  for (const std::string& event : events) EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
  const json usage = json::parse(events[events.size() - 2].substr(6), nullptr, false);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5) << out;
  EXPECT_EQ(usage["choices"], json::array()) << out;
  const json finish = json::parse(events[events.size() - 3].substr(6), nullptr, false);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length") << out;

  // A stream whose client goes away is cancelled: its sequence is freed
  // long before its million tokens would have been made (a few thousand
  // take under a second on a fast machine).
  testing::RunCommand("curl -sN --max-time 1 " + url + " -d '{\"model\": \"" + kModel +
                          "\", \"prompt\": [1, 2, 3], \"max_tokens\": 1000000, \"stream\": true}'"
                          " >/dev/null",
                      &out);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  v1::ServerStatus status;
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext context;
    ASSERT_TRUE(server.stub->GetServerStatus(&context, v1::GetServerStatusRequest(), &status).ok());
    if (status.running_sequences() == 0 && status.requests_failed() >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status.running_sequences(), 0);
  EXPECT_EQ(status.requests_failed(), 1);
}

TEST(HttpApiTest, BadRequestsGetOpenAiErrorsAndTheServerHoldsNothing) {
  const std::string model_dir = testing::GoldenPath("model/" + kModel);
  auto server = testing::StartServer("serve --model " + model_dir +
                                     " --http-port 0 --max-request-bytes 100000");
  ASSERT_GE(server.http_port, 0);
  auto post = [&](const std::string& path, const std::string& body) {
    return RawExchange(server.http_port,
                       absl::StrCat("POST ", path,
                                    " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                    "Content-Length: ",
                                    body.size(), "\r\n\r\n", body));
  };
  auto expect = [](const std::string& response, const std::string& status,
                   const std::string& part) {
    EXPECT_EQ(response.rfind("HTTP/1.1 " + status, 0), 0u) << response;
    EXPECT_NE(response.find(part), std::string::npos) << response;
  };
  expect(post("/v1/completions", "{"), "400", "not JSON");
  expect(post("/v1/completions", "[1]"), "400", "not a JSON object");
  expect(post("/v1/completions", std::string(40, '[') + std::string(40, ']')), "400",
         "nested deeper than the limit of 32");
  expect(post("/v1/completions", R"({"model": "k3-tiny"})"), "400", "prompt: missing");
  // A key twice is not resolved silently (the last once won).
  expect(post("/v1/completions",
              R"({"model": "k3-tiny", "prompt": [1], "max_tokens": 1, "max_tokens": 9})"),
         "400", R"(the key \"max_tokens\" is given twice in one object)");
  expect(post("/v1/completions", R"({"model": "k3-tiny", "prompt": [1], "echo": true})"), "400",
         "\"param\":\"echo\"");
  expect(post("/v1/completions", R"({"model": "k3-tiny", "prompt": [1], "max_tokens": 1e400})"),
         "400", "a number out of the range of a double");
  expect(post("/v1/completions", R"({"model": "k3-tiny", "prompt": [1], "stream_options": {}})"),
         "400", "only allowed when stream is true");
  expect(post("/v1/nowhere", "{}"), "404", "no such endpoint");
  expect(RawExchange(server.http_port,
                     "GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
         "405", "takes POST");
  // A body over --max-request-bytes + 1 MiB is refused from its head.
  expect(
      RawExchange(server.http_port,
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"),
      "413", "over the limit of 1148576");
  // A head over 16 KiB.
  expect(RawExchange(server.http_port, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " +
                                           std::string(20000, 'a') + "\r\n\r\n"),
         "431", "request head");
  // Text over the validator's limit: the gRPC API's error.
  expect(post("/v1/completions",
              R"({"model": "k3-tiny", "prompt": ")" + std::string(100001, 'a') + R"("})"),
         "400", "prompt: 100001 bytes, over the limit of 100000 (--max-request-bytes)");
  // Keep-alive: two requests on one connection.
  const std::string two =
      RawExchange(server.http_port,
                  "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
                  "Connection: close\r\n\r\n");
  EXPECT_NE(two.find("\"object\":\"list\""), std::string::npos) << two;
  EXPECT_NE(two.find("{\"status\":\"ok\"}"), std::string::npos) << two;
}

// A chunked body's trailer, and framing the server does not take: each
// request is refused with a status naming it, and the server goes on (a
// trailer field of 64 KiB once made Beast throw on the connection's thread,
// which ended the process; smaller ones had no limit at all).
TEST(HttpApiTest, TrailersAndUnknownFramingAreRefusedAndTheServerGoesOn) {
  const std::string token = "test-token-0123456789abcdef";
  auto server = testing::StartServer("serve --model " + testing::GoldenPath("model/" + kModel) +
                                     " --http-port 0 --client-tokens-file " + TokenFile(token));
  ASSERT_GE(server.http_port, 0);
  const pid_t pid = server.process->pid();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                           token + "\r\nConnection: close\r\n";
  const std::string body = R"({"model": "k3-tiny", "prompt": [1, 2], "max_tokens": 1})";
  const std::string chunked = absl::StrCat(head, "Transfer-Encoding: chunked\r\n\r\n",
                                           absl::Hex(body.size()), "\r\n", body, "\r\n0\r\n");
  auto alive = [&] {
    const std::string health = RawExchange(
        server.http_port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return health.rfind("HTTP/1.1 200", 0) == 0;
  };
  auto expect = [](const std::string& response, const std::string& status,
                   const std::string& part) {
    EXPECT_EQ(response.rfind("HTTP/1.1 " + status, 0), 0u) << response.substr(0, 300);
    EXPECT_NE(response.find(part), std::string::npos) << response.substr(0, 300);
  };
  // The same body chunked with no trailer is served.
  expect(RawExchange(server.http_port, chunked + "\r\n"), "200", "text_completion");
  const int64_t rss_before = testing::RssBytes(pid);
  // One trailer field of 64 KiB.
  const std::string big =
      RawExchange(server.http_port, chunked + "X-Big: " + std::string(64 << 10, 'a') + "\r\n\r\n");
  EXPECT_TRUE(big.empty() || big.rfind("HTTP/1.1 400", 0) == 0) << big.substr(0, 300);
  ASSERT_TRUE(alive()) << server.process->Log();
  // 32 MiB of 60 KB fields.
  std::string many = chunked;
  for (int i = 0; i < 560; ++i)
    absl::StrAppend(&many, "X-", i, ": ", std::string(60000, 'b'), "\r\n");
  many += "\r\n";
  RawExchange(server.http_port, many);
  ASSERT_TRUE(alive()) << server.process->Log();
  EXPECT_LT(testing::RssBytes(pid) - rss_before, int64_t{16} << 20);
  // A small trailer is refused by name.
  expect(RawExchange(server.http_port, chunked + "X-Checksum: 1\r\n\r\n"), "400",
         "trailer fields after a chunked body are not accepted");
  // A chunk extension longer than the read buffer.
  expect(
      RawExchange(server.http_port,
                  absl::StrCat(head, "Transfer-Encoding: chunked\r\n\r\n", absl::Hex(body.size()),
                               ";ext=", std::string(40000, 'c'), "\r\n", body, "\r\n0\r\n\r\n")),
      "400", "over the limit of 32768 bytes");
  // A Transfer-Encoding other than chunked: its body is not read as the
  // next request.
  const std::string inner = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
                            "\r\nConnection: close\r\n\r\n";
  const std::string gzip =
      RawExchange(server.http_port,
                  absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ",
                               token, "\r\nTransfer-Encoding: gzip\r\n\r\n", inner));
  expect(gzip, "501", "only `chunked`");
  EXPECT_EQ(gzip.find("\"object\":\"list\""), std::string::npos) << gzip;
  expect(RawExchange(server.http_port,
                     absl::StrCat(head, "Transfer-Encoding: gzip, chunked\r\n\r\n",
                                  absl::Hex(body.size()), "\r\n", body, "\r\n0\r\n\r\n")),
         "501", "only `chunked`");
  // Two keys: which counts is not guessed.
  expect(RawExchange(server.http_port,
                     "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: "
                     "Bearer " +
                         token +
                         "\r\nAuthorization: Bearer other\r\n"
                         "Connection: close\r\n\r\n"),
         "400", "more than one Authorization header");
  ASSERT_TRUE(alive()) << server.process->Log();
}

// Bodies count against the memory budget as their bytes arrive, not as
// their heads declare them (a chunked upload once reserved the largest body
// whatever it sent, so four stalled ones locked every other POST out), and
// a JSON tree counts while it is parsed: a body too big to parse within the
// budget is refused before its tree is built (a body of token ids once grew
// the server by 18 to 24 times its size before it was refused).
TEST(HttpApiTest, BodiesAndTheirJsonTreesCountAgainstTheBudgetAsTheyCome) {
  auto server = testing::StartServer("serve --model " + testing::GoldenPath("model/" + kModel) +
                                     " --http-port 0 --grpc-memory-bytes 67108864"
                                     " --max-request-bytes 20000000");
  ASSERT_GE(server.http_port, 0);
  // Four uploads that send 100 KB of a chunked body and stall.
  std::vector<int> stalled;
  for (int i = 0; i < 4; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server.http_port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string part = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        absl::Hex(100000), "\r\n", std::string(100000, ' '));
    ASSERT_EQ(::send(fd, part.data(), part.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(part.size()));
    stalled.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // A body of 4.5 MB beside them is read and served (the three uploads that
  // each reserved 21 MB once left it no room).
  std::string body = R"({"model": "k3-tiny", "max_tokens": 1, "prompt": [1, 2, 3])";
  body += std::string(4500000, ' ') + "}";
  const std::string served = RawExchange(
      server.http_port, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                                     "close\r\nContent-Length: ",
                                     body.size(), "\r\n\r\n", body));
  EXPECT_EQ(served.rfind("HTTP/1.1 200", 0), 0u) << served.substr(0, 400);
  for (int fd : stalled) ::close(fd);

  // 8 MB of token ids: 4M values, whose tree would take far more than the
  // 64 MiB budget.
  const int64_t peak_before = testing::PeakRssBytes(server.process->pid());
  std::string ids = R"({"model": "k3-tiny", "max_tokens": 1, "prompt": [1)";
  ids.reserve(8 << 20);
  for (int i = 0; i < (4 << 20) - 1; ++i) ids += ",1";
  ids += "]}";
  const std::string refused = RawExchange(
      server.http_port, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                                     "close\r\nContent-Length: ",
                                     ids.size(), "\r\n\r\n", ids));
  EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused.substr(0, 400);
  EXPECT_NE(refused.find("JSON values, whose parse would take"), std::string::npos)
      << refused.substr(0, 400);
  EXPECT_LT(testing::PeakRssBytes(server.process->pid()) - peak_before, int64_t{48} << 20);
}

// The prefix cache is each principal's own: another principal's identical
// prompt misses (a hit, or its shorter time to first token, would confirm a
// guess of what was sent), another cache_salt misses, and status shows a
// principal only its own cache activity. --prefix-cache-shared shares it.
TEST(HttpApiTest, ThePrefixCacheIsEachPrincipalsOwnUnlessShared) {
  const std::string dir = testing::TempDir("cache_tokens");
  const std::string tokens = dir + "/tokens";
  std::ofstream(tokens) << "alice:alice-0123456789abcdef\nbob:bob-0123456789abcdef0\n";
  std::filesystem::permissions(
      tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string prompt = absl::StrJoin(testing::RandomTokens(145, 9), ",");
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "per principal");
    auto server = testing::StartServer("serve --model " + testing::GoldenPath("model/" + kModel) +
                                       " --http-port 0 --client-tokens-file " + tokens +
                                       (shared ? " --prefix-cache-shared" : ""));
    ASSERT_GE(server.http_port, 0);
    // The prompt's tokens the cache supplied, for `who` with `salt`.
    auto cached = [&](const std::string& who, const std::string& salt) -> int64_t {
      const std::string body =
          absl::StrCat(R"({"model": "k3-tiny", "max_tokens": 1, "prompt": [)", prompt, "]",
                       salt.empty() ? "" : absl::StrCat(R"(, "cache_salt": ")", salt, "\""), "}");
      const std::string response = RawExchange(
          server.http_port,
          absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ", who,
                       "-0123456789abcdef", who == "bob" ? "0" : "",
                       "\r\nConnection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
      const size_t at = response.find("\r\n\r\n");
      const json r =
          json::parse(response.substr(at == std::string::npos ? 0 : at + 4), nullptr, false);
      if (r.is_discarded() || !r.contains("usage")) {
        ADD_FAILURE() << response;
        return -1;
      }
      return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    };
    EXPECT_EQ(cached("alice", ""), 0);
    EXPECT_EQ(cached("alice", ""), 128);
    EXPECT_EQ(cached("bob", ""), shared ? 128 : 0);
    EXPECT_EQ(cached("alice", "s1"), 0);
    EXPECT_EQ(cached("alice", "s1"), 128);
    EXPECT_EQ(cached("bob", "s1"), shared ? 128 : 0);
    // Each sees its own lookups and hits.
    auto status = [&](const std::string& who) {
      ChannelSecurity security;
      security.token_file = dir + "/" + who;
      std::ofstream(security.token_file)
          << who << "-0123456789abcdef" << (who == "bob" ? "0" : "") << "\n";
      std::filesystem::permissions(security.token_file, std::filesystem::perms::owner_read |
                                                            std::filesystem::perms::owner_write);
      auto channel = OpenChannel(server.address, security, {});
      EXPECT_TRUE(channel.ok()) << channel.status();
      grpc::ClientContext context;
      v1::ServerStatus s;
      EXPECT_TRUE(v1::Generation::NewStub(*channel)
                      ->GetServerStatus(&context, v1::GetServerStatusRequest(), &s)
                      .ok());
      return s.prefix_cache();
    };
    const v1::PrefixCacheStatus alice = status("alice"), bob = status("bob");
    EXPECT_EQ(alice.lookups(), 4);
    EXPECT_EQ(alice.hits(), 2);
    EXPECT_EQ(bob.lookups(), 2);
    EXPECT_EQ(bob.hits(), shared ? 2 : 0);
    EXPECT_EQ(bob.entries(), shared ? 0 : 2);
  }
}

// Sockets that send nothing, or a health check and then nothing, from one
// address or several, cannot lock authenticated clients out: they give way
// to new connections (they once held every one of --http-max-connections,
// and each new connection got 503).
TEST(HttpApiTest, IdleSocketsDoNotLockClientsOut) {
  const std::string token = "test-token-0123456789abcdef";
  auto server = testing::StartServer("serve --model " + testing::GoldenPath("model/" + kModel) +
                                     " --http-port 0 --http-max-connections 64"
                                     " --client-tokens-file " +
                                     TokenFile(token) + " --metrics-port 0");
  ASSERT_GE(server.http_port, 0);
  // A connection from 127.0.0.`host`, holding `send` unanswered or answered.
  auto open = [&](int host, const std::string& send) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + static_cast<uint32_t>(host - 1));
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(server.http_port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    if (!send.empty()) (void)!::send(fd, send.data(), send.size(), MSG_NOSIGNAL);
    return fd;
  };
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<int> idle;
  for (int round = 0; round < 3; ++round) {
    for (int host = 1; host <= 5; ++host) {
      for (int i = 0; i < 40; ++i) idle.push_back(open(host, i % 2 == 0 ? "" : health));
    }
  }
  const std::string models = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                             token + "\r\nConnection: close\r\n\r\n";
  for (int i = 0; i < 5; ++i) {
    const std::string got = RawExchange(server.http_port, models);
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
    idle.push_back(open(1 + i, ""));
  }
  const std::string alive =
      RawExchange(server.http_port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(alive.rfind("HTTP/1.1 200", 0), 0u) << alive;
  // The server said what it did: connections reclaimed, none refused.
  std::string metrics;
  ASSERT_EQ(
      testing::RunCommand(
          absl::StrCat("curl -s http://127.0.0.1:", server.metrics_port, "/metrics"), &metrics),
      0);
  EXPECT_NE(metrics.find("deltaserve_http_connections_refused_total 0\n"), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("deltaserve_http_connections_reclaimed_total 0\n"), std::string::npos)
      << metrics;
  for (int fd : idle) ::close(fd);
}

// A K3-shaped model with the tokenizer fixture of tests/data/tokenizer and
// Kimi Linear's chat tokens: /v1/chat/completions renders with that format. The reply is what the
// gRPC API generates from the rendered prompt's ids, stopping at the format's end tokens, as the
// format parses it; or, where the random model's text does not parse (its
// vocabulary is a quarter special tokens), the 500 that says so.
TEST(HttpApiTest, ChatCompletionsRenderTheConversationAndParseTheReply) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir("chat_model") + "/chat-tiny";
  auto config = PresetConfig("k3-tiny");
  ASSERT_TRUE(config.ok());
  config->vocab_size = 1024;
  ASSERT_TRUE(WriteRandomCheckpoint(*config, dir, 7).ok());
  const std::string fixture = std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer/";
  fs::copy_file(fixture + "tiktoken.model", dir + "/tiktoken.model");
  // The fixture's special tokens, and the rest of Kimi Linear's chat tokens
  // at reserved ids it leaves free.
  json tokenizer_config = json::parse(std::ifstream(fixture + "tokenizer_config.json"));
  for (const auto& [id, token] :
       std::vector<std::pair<int, std::string>>{{681, "<|im_system|>"},
                                                {684, "<|tool_calls_section_begin|>"},
                                                {685, "<|tool_calls_section_end|>"},
                                                {686, "<|tool_call_begin|>"},
                                                {687, "<|tool_call_argument_begin|>"},
                                                {688, "<|tool_call_end|>"}}) {
    tokenizer_config["added_tokens_decoder"][std::to_string(id)] = {
        {"content", token}, {"lstrip", false},      {"normalized", false},
        {"rstrip", false},  {"single_word", false}, {"special", true}};
  }
  std::ofstream(dir + "/tokenizer_config.json") << tokenizer_config.dump(2);
  auto tokenizer = LoadTokenizer(dir, 1024);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto format = LoadChatFormat(dir);
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ((*format)->name(), "kimi_linear");
  auto server = testing::StartServer("serve --model " + dir + " --http-port 0");
  ASSERT_GE(server.http_port, 0);
  const std::string base = absl::StrCat("http://127.0.0.1:", server.http_port, "/v1");
  constexpr int kMaxTokens = 10;
  int parsed = 0;
  // Each conversation's tokens and reply, for batch below.
  struct Want {
    json messages;
    std::vector<int32_t> ids;
    absl::StatusOr<ChatReply> reply;
  };
  std::vector<Want> wants;
  for (const char* user : {"Hello! <|im_end|> is only text here.", "What is 2 + 2?",
                           "Tell me a story", "Bonjour, ça va ?"}) {
    const json messages = json::array(
        {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", user}}});
    auto chat = ParseChatMessages(messages.dump());
    ASSERT_TRUE(chat.ok()) << chat.status();
    ChatRequest request;
    request.messages = *chat;
    auto segments = (*format)->Render(request);
    ASSERT_TRUE(segments.ok()) << segments.status();
    auto prompt = EncodeChat(*segments, **tokenizer);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    v1::GenerateRequest req = testing::TokensRequest(*prompt, kMaxTokens);
    for (const std::string& end : (*format)->end_tokens()) {
      auto id = (*tokenizer)->Encode(end, /*allow_special=*/true);
      ASSERT_TRUE(id.ok() && id->size() == 1) << end;
      req.add_stop_token_ids((*id)[0]);
    }
    const testing::Streamed want = testing::GenerateAll(*server.stub, req);
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();
    const absl::StatusOr<ChatReply> reply = (*format)->Parse(want.text, request.thinking);
    wants.push_back(Want{messages, want.ids, reply});

    // The same conversation over gRPC (a Chat), from a file through
    // `generate` and `client generate`: the same tokens, and over gRPC the
    // same parse of the reply (or INTERNAL saying it does not parse).
    v1::GenerateRequest chat_req;
    ToProto(request, chat_req.mutable_chat());
    chat_req.set_max_tokens(kMaxTokens);
    const testing::Streamed by_chat = testing::GenerateAll(*server.stub, chat_req);
    EXPECT_EQ(by_chat.ids, want.ids);
    if (reply.ok()) {
      ASSERT_TRUE(by_chat.status.ok()) << by_chat.status.error_message();
      EXPECT_EQ(by_chat.completion.reply().content(), reply->content);
      EXPECT_EQ(by_chat.completion.reply().reasoning_content(), reply->reasoning_content);
      EXPECT_EQ(by_chat.completion.reply().tool_calls_size(),
                static_cast<int>(reply->tool_calls.size()));
    } else {
      EXPECT_EQ(by_chat.status.error_code(), grpc::StatusCode::INTERNAL);
      EXPECT_NE(by_chat.status.error_message().find("does not parse"), std::string::npos);
    }
    const std::string file = testing::TempDir("chat_file") + "/messages.json";
    std::ofstream(file) << messages.dump();
    const std::string flags =
        " --messages-file " + file + " --max-tokens " + std::to_string(kMaxTokens) + " --ids";
    std::string out;
    EXPECT_EQ(testing::RunCommand(testing::BinPath("deltaserve") + " generate --model " + dir +
                                      flags + " 2>/dev/null",
                                  &out),
              0);
    EXPECT_EQ(Ids(out), want.ids) << out;
    const int client =
        testing::RunCommand(testing::BinPath("deltaserve") + " client generate --server " +
                                server.address + flags + " 2>/dev/null",
                            &out);
    EXPECT_EQ(client == 0, reply.ok()) << out;
    EXPECT_EQ(Ids(out), want.ids) << out;
    // The Python example client, from the same file.
    const int python = testing::RunCommand(
        absl::StrCat(testing::kSystemPython, " ", DELTASERVE_SOURCE_DIR,
                     "/examples/python/deltaserve_client.py --stubs ", DELTASERVE_PYTHON_DIR,
                     " generate --server ", server.address, flags, " 2>/dev/null"),
        &out);
    EXPECT_EQ(python == 0, reply.ok()) << out;
    EXPECT_EQ(Ids(out), want.ids) << out;

    std::string output;
    ASSERT_EQ(testing::RunCommand(
                  absl::StrCat("PYTHONPATH=", DELTASERVE_PYTHON_DEPS, " ", testing::kSystemPython,
                               " ", DELTASERVE_SOURCE_DIR,
                               "/tests/runtime/serving/openai_client_check.py chat ", base,
                               " none chat-tiny '", messages.dump(), "' ", kMaxTokens, " 2>&1"),
                  &output),
              0)
        << output;
    const json r = json::parse(output, nullptr, false);
    ASSERT_FALSE(r.is_discarded()) << output;
    if (!reply.ok()) {
      EXPECT_EQ(r["reply"]["error"]["status"], 500) << output;
      EXPECT_NE(r["reply"]["error"]["message"].get<std::string>().find("does not parse"),
                std::string::npos)
          << output;
      // Said once: the streamed error is the server's one wording.
      const std::string streamed = r["stream"]["error"].get<std::string>();
      const size_t at = streamed.find("does not parse");
      EXPECT_NE(at, std::string::npos) << output;
      EXPECT_EQ(streamed.find("does not parse", at + 1), std::string::npos) << output;
      continue;
    }
    ++parsed;
    for (const char* mode : {"reply", "stream"}) {
      const json& got = r[mode];
      EXPECT_EQ(got["ids"].get<std::vector<int32_t>>(), want.ids) << mode << output;
      EXPECT_EQ(got["content"].is_null() ? "" : got["content"].get<std::string>(), reply->content)
          << mode << output;
      EXPECT_EQ(
          got["reasoning_content"].is_null() ? "" : got["reasoning_content"].get<std::string>(),
          reply->reasoning_content)
          << mode << output;
      EXPECT_EQ(got["tool_calls"].size(), reply->tool_calls.size()) << mode << output;
      const std::string finish = !reply->tool_calls.empty() ? "tool_calls"
                                 : want.completion.finish_reason() == v1::FINISH_REASON_STOP
                                     ? "stop"
                                     : "length";
      EXPECT_EQ(got["finish_reason"], finish) << mode << output;
    }
    EXPECT_EQ(r["reply"]["usage"], json::array({static_cast<int64_t>(prompt->size()),
                                                static_cast<int64_t>(want.ids.size())}))
        << output;
    EXPECT_EQ(r["reply"]["object"], "chat.completion");
    EXPECT_EQ(r["stream"]["role"], "assistant");
  }
  // The random model's replies are not all noise the format refuses.
  EXPECT_GE(parsed, 1);

  // The conversations as `deltaserve batch` lines, run here and through the
  // server: the same tokens and replies, or the same refusal.
  const std::string batch_dir = testing::TempDir("chat_batch");
  {
    std::ofstream lines(batch_dir + "/in.jsonl");
    for (size_t i = 0; i < wants.size(); ++i) {
      lines << json{{"id", i}, {"messages", wants[i].messages}, {"max_tokens", kMaxTokens}}.dump()
            << "\n";
    }
  }
  for (const std::string& where : {" --model " + dir, " --server " + server.address}) {
    SCOPED_TRACE(where);
    const std::string output = batch_dir + "/out" + std::to_string(where.size()) + ".jsonl";
    std::string log;
    ASSERT_EQ(testing::RunCommand(testing::BinPath("deltaserve") + " batch" + where + " --input " +
                                      batch_dir + "/in.jsonl --output " + output + " 2>&1",
                                  &log),
              0)
        << log;
    std::map<std::string, json> records;
    std::ifstream in(output);
    for (std::string line; std::getline(in, line);) {
      const json r = json::parse(line);
      records[r["id"].dump()] = r;
    }
    ASSERT_EQ(records.size(), wants.size()) << log;
    for (size_t i = 0; i < wants.size(); ++i) {
      const json& r = records[std::to_string(i)];
      if (!wants[i].reply.ok()) {
        EXPECT_NE(r.value("error", "").find("does not parse"), std::string::npos) << r.dump();
        continue;
      }
      EXPECT_EQ(r["token_ids"].get<std::vector<int32_t>>(), wants[i].ids) << r.dump();
      EXPECT_EQ(r["reply"]["content"], wants[i].reply->content) << r.dump();
      EXPECT_EQ(r["reply"]["reasoning_content"], wants[i].reply->reasoning_content) << r.dump();
      EXPECT_EQ(r["reply"]["tool_calls"].size(), wants[i].reply->tool_calls.size()) << r.dump();
    }
  }

  // A conversation scored as it stands (no generation prompt after it), by
  // `score` and `client score`: what scoring its rendering's ids gives.
  {
    const json messages = json::array({{{"role", "user"}, {"content", "What is 2 + 2?"}},
                                       {{"role", "assistant"}, {"content", "4"}}});
    const std::string file = batch_dir + "/scored.json";
    std::ofstream(file) << messages.dump();
    ChatRequest request;
    request.messages = *ParseChatMessages(messages.dump());
    request.add_generation_prompt = false;
    auto ids = EncodeChat(*(*format)->Render(request), **tokenizer);
    ASSERT_TRUE(ids.ok()) << ids.status();
    const std::string by_ids = " --tokens " + absl::StrJoin(*ids, ",") + " 2>/dev/null";
    const std::string by_chat = " --messages-file " + file + " 2>/dev/null";
    Deltaserve("score --model " + dir + " --logprobs-out " + batch_dir + "/chat.st" + by_chat);
    Deltaserve("score --model " + dir + " --logprobs-out " + batch_dir + "/ids.st" + by_ids);
    auto bytes = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_FALSE(bytes(batch_dir + "/ids.st").empty());
    EXPECT_EQ(bytes(batch_dir + "/chat.st"), bytes(batch_dir + "/ids.st"));
    const std::string scored = Deltaserve("client score --server " + server.address + by_ids);
    EXPECT_NE(scored.find('\n'), std::string::npos) << scored;
    EXPECT_EQ(Deltaserve("client score --server " + server.address + by_chat), scored);
  }

  // A conversation file that is not one, and a model without a chat format,
  // are named.
  const std::string bad = testing::TempDir("chat_bad") + "/bad.json";
  std::ofstream(bad) << R"({"messages": [{"role": "user", "content": "hi"}], "tool": []})";
  std::string out;
  EXPECT_NE(testing::RunCommand(testing::BinPath("deltaserve") + " generate --model " + dir +
                                    " --messages-file " + bad + " 2>&1",
                                &out),
            0);
  EXPECT_NE(out.find(bad + ": tool: not a field of a conversation"), std::string::npos) << out;
  std::ofstream(bad) << R"([{"role": "user", "content": "hi"}])";
  EXPECT_NE(testing::RunCommand(testing::BinPath("deltaserve") + " generate --model " +
                                    testing::GoldenPath("model/" + kModel) + " --messages-file " +
                                    bad + " 2>&1",
                                &out),
            0);
  EXPECT_NE(out.find("chat"), std::string::npos) << out;

  // A model without a chat format refuses conversations by name.
  auto plain = testing::StartServer("serve --model " + testing::GoldenPath("model/" + kModel) +
                                    " --http-port 0");
  const std::string body = absl::StrCat(R"({"model": ")", kModel,
                                        R"(", "messages": [{"role": "user", "content": "hi"}]})");
  const std::string refused =
      RawExchange(plain.http_port, absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                                "Connection: close\r\nContent-Length: ",
                                                body.size(), "\r\n\r\n", body));
  EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused;
  EXPECT_NE(refused.find("this model has no chat format"), std::string::npos) << refused;
}

}  // namespace
}  // namespace deltaserve
