// For the e2e tests: a real `deltaserve serve|coordinator|worker` process on
// loopback and a gRPC client of it.
#pragma once

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "deltaserve/v1/generation.grpc.pb.h"
#include "runtime/serving/credentials.h"
#include "runtime/serving/worker_token.h"
#include "tests/test_util.h"

namespace deltaserve::testing {

struct ServerUnderTest {
  std::unique_ptr<ChildProcess> process;
  int port = 0, metrics_port = -1, http_port = -1;
  std::string address;         // 127.0.0.1:port, the client API
  std::string worker_address;  // where workers attach (--coordinator of `deltaserve worker`)
  // The worker token a coordinator without worker credentials made (beside
  // its port file; it may not exist).
  std::string worker_token_file;
  std::unique_ptr<v1::Generation::Stub> stub;
};

// A field of /proc/PID/status ("Threads"; "VmRSS", "VmHWM" in kB). A field
// that is not there (the process has gone) fails the test and gives -1.
inline int64_t ProcStatus(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  ADD_FAILURE() << "no " << field << " in /proc/" << pid << "/status";
  return -1;
}

// The resident set of a process, and its peak, in bytes.
inline int64_t RssBytes(pid_t pid) { return ProcStatus(pid, "VmRSS") * 1024; }
inline int64_t PeakRssBytes(pid_t pid) { return ProcStatus(pid, "VmHWM") * 1024; }

// Starts `build/bin/deltaserve <command_and_flags> --port 0 --port-file F`
// (and --worker-port 0 for a coordinator) and waits until it listens.
inline ServerUnderTest StartServer(const std::string& command_and_flags) {
  ServerUnderTest s;
  const std::string dir = TempDir("server");
  const std::string port_file = dir + "/port";
  const bool coordinator = command_and_flags.rfind("coordinator ", 0) == 0;
  s.process = ChildProcess::Start(BinPath("deltaserve") + " " + command_and_flags +
                                      " --host 127.0.0.1 --port 0 --port-file " + port_file +
                                      (coordinator ? " --worker-port 0" : ""),
                                  dir + "/log");
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(port_file)) {
    if (s.process->Wait(std::chrono::milliseconds(20))) {
      ADD_FAILURE() << "the server exited: " << s.process->Log();
      return s;
    }
    if (std::chrono::steady_clock::now() > end) {
      ADD_FAILURE() << "the server did not start: " << s.process->Log();
      return s;
    }
  }
  // The client port, the metrics port, the worker port, the HTTP port (-1: none).
  std::ifstream in(port_file);
  int worker_port = -1;
  in >> s.port >> s.metrics_port >> worker_port >> s.http_port;
  s.address = "127.0.0.1:" + std::to_string(s.port);
  if (worker_port >= 0) s.worker_address = "127.0.0.1:" + std::to_string(worker_port);
  s.worker_token_file = port_file + ".worker-token";
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  s.stub = v1::Generation::NewStub(
      grpc::CreateCustomChannel(s.address, grpc::InsecureChannelCredentials(), args));
  return s;
}

// A plaintext channel to a coordinator's worker port at `address` for a
// worker this test forges: it sends the worker token a coordinator of this
// user made for that port, found where `deltaserve worker` finds it
// (runtime/serving/worker_token.h), when there is one.
inline std::shared_ptr<grpc::Channel> WorkerChannel(const std::string& address,
                                                    grpc::ChannelArguments args = {}) {
  ChannelSecurity security;
  if (std::optional<int> port = TargetPort(address)) {
    const std::string path = DefaultWorkerTokenPath(*port);
    if (!path.empty() && std::filesystem::exists(path)) security.token_file = path;
  }
  auto channel = OpenChannel(address, security, args);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok()
             ? *channel
             : grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// A whole Generate stream: the token ids, text, completion and status.
struct Streamed {
  std::vector<int32_t> ids;
  std::string text;
  v1::Completion completion;
  grpc::Status status;
  std::chrono::steady_clock::time_point first_token, end;
};

inline Streamed GenerateAll(v1::Generation::Stub& stub, const v1::GenerateRequest& req,
                            double timeout_s = 300) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  Streamed out;
  auto reader = stub.Generate(&context, req);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const auto& t : response.tokens()) {
      if (out.ids.empty()) out.first_token = std::chrono::steady_clock::now();
      out.ids.push_back(t.id());
      out.text += t.text();
    }
    if (response.has_completion()) out.completion = response.completion();
  }
  out.status = reader->Finish();
  out.end = std::chrono::steady_clock::now();
  return out;
}

inline v1::GenerateRequest TokensRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  req.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  req.set_max_tokens(max_tokens);
  return req;
}

// A sampled request with a seed: a run that moves to another replica goes
// on with the tokens of an undisturbed run (each draw is keyed by the seed and
// the position), and, unlike greedy decoding, a rounding difference in the
// replayed prompt's logits does not flip a near tie.
inline v1::GenerateRequest SeededRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest req = TokensRequest(prompt, max_tokens);
  req.mutable_sampling()->set_temperature(0.9f);
  req.mutable_sampling()->set_top_k(50);
  req.mutable_sampling()->set_seed(1234);
  return req;
}

inline v1::ServerStatus Status(v1::Generation::Stub& stub) {
  grpc::ClientContext context;
  v1::ServerStatus status;
  EXPECT_TRUE(stub.GetServerStatus(&context, v1::GetServerStatusRequest(), &status).ok());
  return status;
}

// Polls until `done(status)` or the timeout; returns whether it came.
template <typename Pred>
bool WaitForStatus(v1::Generation::Stub& stub, Pred done, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done(Status(stub))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The body of GET http://127.0.0.1:port/path (empty on any failure).
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
    if (send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// tests/runtime/serving/grpc_probe.py, with Debian's python3.
inline std::string Probe(const std::string& args, int* code = nullptr) {
  std::string output;
  const int rc = RunCommand(std::string(kSystemPython) + " " + DELTASERVE_SOURCE_DIR +
                                "/tests/runtime/serving/grpc_probe.py " + args,
                            &output);
  if (code != nullptr) *code = rc;
  return output;
}

// Whether `address`'s grpc.health.v1 status becomes `want` (SERVING,
// NOT_SERVING) within 30 s.
inline bool WaitForHealth(const std::string& address, const std::string& want) {
  for (int i = 0; i < 300; ++i) {
    if (Probe("health " + address) == want + "\n") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace deltaserve::testing
