// bench-serve: a load generator for a running server. N clients each stream
// requests back to back; reports requests/s, output tokens/s, time to first
// token and time per output token (median and p99), as the client sees them,
// over gRPC and, with --http, over the OpenAI HTTP API in the same run.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "deltaserve/v1/generation.grpc.pb.h"
#include "kernels/threads.h"
#include "launcher/channel_flags.h"
#include "launcher/commands.h"
#include "launcher/flags.h"
#include "runtime/comm/host_data_communicator.h"
#include "runtime/comm/single_communicator.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/replica.h"
#include "runtime/model/model.h"
#include "runtime/scheduler/offline_engine.h"
#include "runtime/serving/grpc_status.h"

namespace deltaserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  double ttft_s = 0, tpot_s = 0, total_s = 0;
  int64_t tokens = 0;
};

double Percentile(std::vector<double> v, double q) {  // nearest rank
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

absl::StatusOr<Sample> OneRequest(v1::Generation::Stub& stub, const v1::GenerateRequest& req) {
  grpc::ClientContext context;
  const auto start = Clock::now();
  auto reader = stub.Generate(&context, req);
  v1::GenerateResponse response;
  Sample s;
  Clock::time_point first, last;
  while (reader->Read(&response)) {
    const auto now = Clock::now();
    for (int i = 0; i < response.tokens_size(); ++i) {
      if (s.tokens++ == 0) first = now;
      last = now;
    }
  }
  DELTASERVE_RETURN_IF_ERROR(FromGrpc(reader->Finish()));
  const auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  s.total_s = secs(start, Clock::now());
  s.ttft_s = s.tokens > 0 ? secs(start, first) : s.total_s;
  s.tpot_s = s.tokens > 1 ? secs(first, last) / static_cast<double>(s.tokens - 1) : 0;
  return s;
}

// The same request over the HTTP API (POST /v1/completions, streamed; no
// TLS), on a connection of its own. A token is counted as its event
// arrives: each event of a stream without logprobs carries the text of the
// tokens made since the last, so with one token per step an event is a
// token; `usage` gives the count.
absl::StatusOr<Sample> OneHttpRequest(const std::string& host, const std::string& port,
                                      const std::string& model, const v1::GenerateRequest& req) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  using tcp = boost::asio::ip::tcp;
  std::string body = absl::StrCat(R"({"model": ")", model, R"(", "prompt": [)",
                                  absl::StrJoin(req.tokens().ids(), ","), R"(], "max_tokens": )",
                                  req.max_tokens(), R"(, "temperature": 0, "ignore_eos": true, )",
                                  R"("stream": true, "stream_options": {"include_usage": true}})");
  const auto start = Clock::now();
  boost::asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  tcp::resolver resolver(io);
  boost::asio::connect(socket, resolver.resolve(host, port, ec), ec);
  if (ec) return absl::UnavailableError(absl::StrCat(host, ":", port, ": ", ec.message()));
  http::request<http::string_body> request{http::verb::post, "/v1/completions", 11};
  request.set(http::field::host, host);
  request.set(http::field::content_type, "application/json");
  request.body() = std::move(body);
  request.prepare_payload();
  http::write(socket, request, ec);
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  if (!ec) http::read_header(socket, buffer, parser, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("the HTTP API: ", ec.message()));
  if (parser.get().result_int() != 200) {
    return absl::InternalError(absl::StrCat("the HTTP API answered ", parser.get().result_int()));
  }
  Sample s;
  Clock::time_point first, last;
  std::string events;
  int64_t text_events = 0;
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    // Whatever has arrived: read() would wait for the whole buffer.
    http::read_some(socket, buffer, parser, ec);
    if (ec && ec != http::error::need_buffer) {
      return absl::UnavailableError(absl::StrCat("the HTTP API's stream: ", ec.message()));
    }
    events.append(chunk, sizeof(chunk) - parser.get().body().size);
    // Whole events: "data: {...}\n\n"; a text chunk holds `"finish_reason":null`.
    for (size_t end; (end = events.find("\n\n")) != std::string::npos; events.erase(0, end + 2)) {
      const std::string_view event(events.data(), end);
      if (event.find(R"("finish_reason":null)") != std::string_view::npos) {
        const auto now = Clock::now();
        if (text_events++ == 0) first = now;
        last = now;
      } else if (const size_t at = event.find(R"("completion_tokens":)");
                 at != std::string_view::npos) {
        s.tokens = std::atoll(event.data() + at + 20);
      } else if (event.find(R"("error")") != std::string_view::npos) {
        return absl::InternalError(absl::StrCat("the HTTP API's stream: ", std::string(event)));
      }
    }
  }
  const auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  s.total_s = secs(start, Clock::now());
  s.ttft_s = text_events > 0 ? secs(start, first) : s.total_s;
  s.tpot_s = s.tokens > 1 ? secs(first, last) / static_cast<double>(s.tokens - 1) : 0;
  return s;
}

// The model's name in the HTTP API (GET /v1/models).
absl::StatusOr<std::string> HttpModelName(const std::string& host, const std::string& port) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  using tcp = boost::asio::ip::tcp;
  boost::asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  tcp::resolver resolver(io);
  boost::asio::connect(socket, resolver.resolve(host, port, ec), ec);
  http::request<http::empty_body> request{http::verb::get, "/v1/models", 11};
  request.set(http::field::host, host);
  if (!ec) http::write(socket, request, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  if (!ec) http::read(socket, buffer, response, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("--http ", host, ":", port, ": ", ec.message()));
  const nlohmann::json models = nlohmann::json::parse(response.body(), nullptr, false);
  if (response.result_int() != 200 || !models.is_object() || !models.contains("data") ||
      !models["data"].is_array() || models["data"].empty() ||
      !models["data"][0].value("id", nlohmann::json()).is_string()) {
    return absl::InternalError(absl::StrCat("--http ", host, ":", port, ": /v1/models answered ",
                                            response.result_int(), ": ",
                                            response.body().substr(0, 200)));
  }
  return models["data"][0]["id"].get<std::string>();
}

// Request i of client c: distinct prompts, so no request reuses another's work.
v1::GenerateRequest MakeRequest(int c, int64_t i, int64_t prompt_tokens, int64_t max_tokens,
                                int64_t vocab) {
  v1::GenerateRequest req;
  for (int64_t t = 0; t < prompt_tokens; ++t) {
    req.mutable_tokens()->add_ids(static_cast<int32_t>((t * 7 + c * 131 + i * 17 + 1) % vocab));
  }
  req.set_max_tokens(static_cast<int32_t>(max_tokens));
  req.set_ignore_eos(true);
  return req;
}

// Serving overhead for one request: the same request served and through
// `deltaserve generate`'s code path in this process (the offline engine),
// alternated `repeats` times after one warm-up each, so that drift in the
// machine's speed falls on both alike. Returns the two medians, in seconds.
absl::StatusOr<std::pair<double, double>> CompareWithGenerate(v1::Generation::Stub& stub,
                                                              const std::string& dir,
                                                              const v1::GenerateRequest& req,
                                                              int repeats) {
  DELTASERVE_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir));
  SingleCommunicator world;
  SingleDataCommunicator stage;
  const WorldLayout layout = *WorldLayout::Make(1, 1, 1);
  StepExecutor executor(*model, layout, world, stage);
  Replica replica(executor);
  SequenceRequest request;
  request.prompt.assign(req.tokens().ids().begin(), req.tokens().ids().end());
  request.max_tokens = req.max_tokens();
  SchedulerOptions options;
  options.step_tokens = static_cast<int64_t>(request.prompt.size());
  options.fixed_chunk = options.step_tokens;
  options.cache_pages = replica.cache_pages();
  options.state_slots = replica.state_slots();
  std::vector<double> served, local;
  for (int r = 0; r <= repeats; ++r) {
    DELTASERVE_ASSIGN_OR_RETURN(Sample s, OneRequest(stub, req));
    OfflineEngine engine(replica, model->config(), options);
    request.id = static_cast<uint64_t>(r + 1);
    engine.Add(request);
    const auto start = Clock::now();
    DELTASERVE_RETURN_IF_ERROR(engine.Run([](const SchedulerEvent&) {}));
    if (r == 0) continue;  // warm-up
    local.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    served.push_back(s.total_s);
  }
  return std::make_pair(Percentile(served, 0.5), Percentile(local, 0.5));
}

}  // namespace

const CommandSpec& BenchServeSpec() {
  static const auto* spec = new CommandSpec{
      .name = "bench-serve",
      .summary = "load a running server with N streaming clients; prints a markdown table",
      .usage = "--server HOST:PORT [flags]",
      .flags = Concat(
          {
              {"server", "HOST:PORT", "the server", "127.0.0.1:50051"},
              {"http", "HOST:PORT",
               "also run every row over the server's OpenAI HTTP API at HOST:PORT "
               "(--http-port; plaintext), after its gRPC row"},
              {"concurrency", "1,8,32", "client counts, one table row each", "1,8,32"},
              {"prompt-tokens", "N", "prompt tokens per request", "128"},
              {"max-tokens", "N", "output tokens per request", "64"},
              {"requests", "N", "requests per row (0: 2 per client, at least 4)", "0"},
              {"warmup", "N",
               "requests sent one at a time before the table and not counted, so that the "
               "first row (the one the speedups divide by) does not pay the server's first-use "
               "costs",
               "2"},
              {"compare-model", "DIR",
               "also time one request through `generate`'s path in this process (the serving "
               "overhead)"},
              {"threads", "N", "compute threads for --compare-model", "0"},
          },
          ChannelSecurityFlags("token-file")),
      .examples = {"deltaserve bench-serve --server 127.0.0.1:50051 --concurrency 1,8,32"},
  };
  return *spec;
}

absl::Status RunBenchServe(const Args& args) {
  DELTASERVE_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(BenchServeSpec(), args));
  DELTASERVE_ASSIGN_OR_RETURN(
      std::vector<int32_t> levels,
      ParseTokenList(flags.GetString("concurrency", "1,8,32"), "--concurrency"));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t prompt_tokens, flags.GetInt("prompt-tokens", 128));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t max_tokens, flags.GetInt("max-tokens", 64));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t requests, flags.GetInt("requests", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 0));
  DELTASERVE_ASSIGN_OR_RETURN(int64_t warmup, flags.GetInt("warmup", 2));
  if (warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  kernels::SetNumThreads(static_cast<int>(threads));
  if (prompt_tokens < 1 || max_tokens < 1) {
    return absl::InvalidArgumentError("--prompt-tokens and --max-tokens must be >= 1");
  }
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  DELTASERVE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                              OpenChannel(flags.GetString("server", "127.0.0.1:50051"),
                                          ChannelSecurityFrom(flags, "token-file"), channel_args));
  auto stub = v1::Generation::NewStub(channel);
  v1::ModelInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    context.set_wait_for_ready(true);
    DELTASERVE_RETURN_IF_ERROR(
        FromGrpc(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info)));
  }
  std::printf("# bench-serve: %s, %lld prompt tokens, %lld output tokens per request\n",
              info.model_type().c_str(), static_cast<long long>(prompt_tokens),
              static_cast<long long>(max_tokens));
  // The server's first requests pay one-time costs (kernels generated at
  // first use, pages of the weights and caches touched for the first time);
  // counted in the first row, they made one client look slow and every
  // speedup over it larger than the ideal. Prompts distinct from the rows'.
  for (int64_t i = 0; i < warmup; ++i) {
    DELTASERVE_RETURN_IF_ERROR(
        OneRequest(*stub, MakeRequest(1 << 20, i, prompt_tokens, max_tokens, info.vocab_size()))
            .status());
  }
  if (warmup > 0) {
    std::printf("# warm-up: %lld requests, not counted\n", static_cast<long long>(warmup));
  }
  // The HTTP API's address, and the model's name there.
  std::string http_host, http_port, http_model;
  if (flags.Has("http")) {
    const std::string address = flags.GetString("http");
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError("--http: give HOST:PORT");
    }
    http_host = address.substr(0, colon);
    http_port = address.substr(colon + 1);
    DELTASERVE_ASSIGN_OR_RETURN(http_model, HttpModelName(http_host, http_port));
  }
  // With --http the rows say which API they ran over.
  const bool both = !http_model.empty();
  std::printf(
      "%s| clients | requests | requests/s | output tokens/s | TTFT median ms | "
      "TTFT p99 ms | TPOT median ms | TPOT p99 ms | latency median ms |\n",
      both ? "| API " : "");
  std::printf("%s|---|---|---|---|---|---|---|---|---|\n", both ? "|---" : "");
  std::map<bool, double> single_rate;
  for (int32_t n : levels) {
    if (n < 1) return absl::InvalidArgumentError("--concurrency levels must be >= 1");
    for (const bool http : {false, true}) {
      if (http && http_model.empty()) continue;
      // By default two requests per client, and at least four in all.
      const int64_t total = requests > 0 ? requests : std::max<int64_t>(4, 2 * n);
      const int64_t per_client = std::max<int64_t>(1, total / n);
      std::mutex mu;
      std::vector<Sample> samples;
      absl::Status failure;
      const auto start = Clock::now();
      std::vector<std::thread> clients;
      for (int c = 0; c < n; ++c) {
        clients.emplace_back([&, c] {
          for (int64_t i = 0; i < per_client; ++i) {
            const v1::GenerateRequest req =
                MakeRequest(c, i, prompt_tokens, max_tokens, info.vocab_size());
            auto s = http ? OneHttpRequest(http_host, http_port, http_model, req)
                          : OneRequest(*stub, req);
            std::lock_guard<std::mutex> lock(mu);
            if (s.ok()) {
              samples.push_back(*s);
            } else if (failure.ok()) {
              failure = s.status();
            }
          }
        });
      }
      for (auto& t : clients) t.join();
      const double wall = std::chrono::duration<double>(Clock::now() - start).count();
      DELTASERVE_RETURN_IF_ERROR(failure);
      std::vector<double> ttft, tpot, latency;
      int64_t tokens = 0;
      for (const Sample& s : samples) {
        ttft.push_back(s.ttft_s * 1e3);
        tpot.push_back(s.tpot_s * 1e3);
        latency.push_back(s.total_s * 1e3);
        tokens += s.tokens;
      }
      std::printf("%s| %d | %zu | %.2f | %.1f | %.1f | %.1f | %.2f | %.2f | %.1f |\n",
                  both ? (http ? "| HTTP " : "| gRPC ") : "", n, samples.size(),
                  samples.size() / wall, tokens / wall, Percentile(ttft, 0.5),
                  Percentile(ttft, 0.99), Percentile(tpot, 0.5), Percentile(tpot, 0.99),
                  Percentile(latency, 0.5));
      std::fflush(stdout);
      if (n == 1) {
        single_rate[http] = tokens / wall;
      } else if (single_rate[http] > 0) {
        std::printf("#   %s%d clients: %.2fx the output tokens/s of one client (ideal %d)\n",
                    both ? (http ? "HTTP, " : "gRPC, ") : "", n, tokens / wall / single_rate[http],
                    n);
      }
    }
  }
  if (flags.Has("compare-model")) {
    DELTASERVE_ASSIGN_OR_RETURN(
        auto medians,
        CompareWithGenerate(*stub, flags.GetString("compare-model"),
                            MakeRequest(0, 0, prompt_tokens, max_tokens, info.vocab_size()), 7));
    const auto [served, local] = medians;
    std::printf(
        "# one request, served vs deltaserve generate's path in-process (median of 7, "
        "alternated): %.1f ms vs %.1f ms, serving overhead %+.1f%%\n",
        served * 1e3, local * 1e3, (served / local - 1) * 100);
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
