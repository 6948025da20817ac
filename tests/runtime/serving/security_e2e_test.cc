// The serving ports under attack, with real processes: `deltaserve
// coordinator` with bearer tokens or TLS (certificates made here with
// Debian's openssl), real `deltaserve worker`s with and without credentials,
// and clients with wrong ones. Each refusal and each success of
// docs/security.md: tokens, TLS and mutual TLS on both ports, workers that
// cannot attach, the ports serving only their own services, abort by
// principal, a header flood, only the announced ports listening, and a
// non-loopback host refused without TLS or tokens.
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "deltaserve/v1/worker.grpc.pb.h"
#include "runtime/comm/world_layout.h"
#include "runtime/model/config.h"
#include "runtime/serving/credentials.h"
#include "runtime/serving/worker_codec.h"
#include "tests/runtime/serving/serving_test_util.h"

namespace deltaserve {
namespace {

namespace fs = std::filesystem;

std::string K3Tiny() { return testing::GoldenPath("model/k3-tiny"); }

void WriteSecret(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  ASSERT_EQ(chmod(path.c_str(), 0600), 0) << path;
}

std::string Slurp(const std::string& path) {
  std::ostringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

void Shell(const std::string& command) {
  std::string output;
  ASSERT_EQ(testing::RunCommand(command, &output), 0) << command << "\n" << output;
}

// Made once for the suite: a CA, a server certificate for 127.0.0.1 and
// localhost, client certificates of that CA, a CA of the workers with a
// worker certificate, and a CA that the servers do not trust with a client
// certificate of its own; token files.
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::TempDir("security"));
    const std::string& d = *dir_;
    const std::string key = "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    for (const std::string ca : {"ca", "worker-ca", "rogue-ca"}) {
      Shell("cd " + d + " && openssl req -x509 " + key.substr(12) + "-keyout " + ca + ".key -out " +
            ca + ".pem -days 2 -subj /CN=deltaserve-test-" + ca + " 2>&1");
    }
    std::ofstream(d + "/server.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                     << "extendedKeyUsage=serverAuth\n";
    std::ofstream(d + "/client.ext") << "extendedKeyUsage=clientAuth\n";
    auto sign = [&](const std::string& name, const std::string& ca, const std::string& ext) {
      Shell("cd " + d + " && " + key + "-keyout " + name + ".key -out " + name +
            ".csr -subj /CN=" + name + " 2>&1 && openssl x509 -req -in " + name + ".csr -CA " + ca +
            ".pem -CAkey " + ca + ".key -CAcreateserial -days 2 -out " + name + ".pem -extfile " +
            ext + " 2>&1 && chmod 600 " + name + ".key");
    };
    sign("server", "ca", "server.ext");
    sign("alice", "ca", "client.ext");
    sign("carol", "ca", "client.ext");
    sign("worker", "worker-ca", "client.ext");
    sign("mallory", "rogue-ca", "client.ext");
    WriteSecret(d + "/clients",
                "# principal:token\nalice:alice-0123456789abcdef\n"
                "bob:bob-0123456789abcdef0\n");
    WriteSecret(d + "/alice", "alice:alice-0123456789abcdef\n");
    WriteSecret(d + "/bob", "bob:bob-0123456789abcdef0\n");
    WriteSecret(d + "/wrong", "not-a-token-of-this-server\n");
    WriteSecret(d + "/workers", "worker-secret-0123456789abcdef\n");
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  static std::unique_ptr<v1::Generation::Stub> Client(const std::string& address,
                                                      const ChannelSecurity& security) {
    auto channel = OpenChannel(address, security, grpc::ChannelArguments());
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? v1::Generation::NewStub(*channel) : nullptr;
  }
  static ChannelSecurity Token(const std::string& file) {
    ChannelSecurity s;
    s.token_file = File(file);
    return s;
  }
  // TLS trusting `ca`, with the client certificate `cert` if not empty.
  static ChannelSecurity Tls(const std::string& ca, const std::string& cert = "") {
    ChannelSecurity s;
    s.ca_file = File(ca + ".pem");
    if (!cert.empty()) {
      s.cert_file = File(cert + ".pem");
      s.key_file = File(cert + ".key");
    }
    return s;
  }

  static grpc::Status StatusCall(v1::Generation::Stub& stub, v1::ServerStatus* out = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerStatus status;
    grpc::Status s = stub.GetServerStatus(&context, v1::GetServerStatusRequest(), &status);
    if (out != nullptr) *out = status;
    return s;
  }
  static int Workers(v1::Generation::Stub& stub) {
    v1::ServerStatus status;
    return StatusCall(stub, &status).ok() ? status.workers() : -1;
  }

  // A `deltaserve worker` attaching to `address` with `flags`.
  static std::unique_ptr<testing::ChildProcess> StartWorker(const std::string& address,
                                                            const std::string& flags,
                                                            const std::string& log) {
    return testing::ChildProcess::Start(testing::BinPath("deltaserve") + " worker --coordinator " +
                                            address + " --model " + K3Tiny() +
                                            " --threads 1 --connect-timeout 5 " + flags,
                                        *dir_ + "/" + log);
  }

  // A worker without the credentials the coordinator asks for: it ends with
  // an error and never counts as attached.
  static void ExpectRefused(const std::string& address, const std::string& flags,
                            const std::string& log, v1::Generation::Stub& observer,
                            const std::string& why) {
    auto worker = StartWorker(address, flags, log);
    const std::optional<int> code = worker->Wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "the worker is still running: " << worker->Log();
    EXPECT_NE(*code, 0) << worker->Log();
    EXPECT_NE(worker->Log().find(why), std::string::npos) << worker->Log();
    EXPECT_EQ(Workers(observer), 0);
  }

  static std::string* dir_;
};

std::string* SecurityTest::dir_ = nullptr;

// The TCP ports `pid` listens on: its sockets' inodes matched against
// /proc/PID/net/tcp and tcp6 (state 0A is LISTEN). *all_loopback: whether
// every one of them is bound to 127.0.0.1 (or its IPv4-mapped IPv6 form).
std::set<int> ListeningPorts(pid_t pid, bool* all_loopback) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  for (const auto& entry : fs::directory_iterator(proc + "/fd")) {
    std::error_code error;
    const std::string target = fs::read_symlink(entry.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<int> ports;
  *all_loopback = true;
  for (const std::string table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && inodes.count(inode)) {
        const size_t colon = local.find(':');
        ports.insert(std::stoi(local.substr(colon + 1), nullptr, 16));
        // /proc prints addresses as 32-bit words in host order.
        const std::string address = local.substr(0, colon);
        *all_loopback &= address == "0100007F" || address == "0000000000000000FFFF00000100007F";
      }
    }
  }
  return ports;
}

// examples/python/deltaserve_client.py generate, with `flags`: its exit code;
// its output in *output.
int PythonGenerate(const std::string& address, const std::string& flags, std::string* output) {
  return testing::RunCommand(std::string(testing::kSystemPython) + " " + DELTASERVE_SOURCE_DIR +
                                 "/examples/python/deltaserve_client.py --stubs " +
                                 DELTASERVE_PYTHON_DIR + " generate --server " + address +
                                 " --tokens 1,2,3 --max-tokens 4 --ids " + flags,
                             output);
}

// The owner's long request "job-1" streams; `other`'s Abort of that id does
// not find it and the request keeps streaming; the owner's Abort ends it.
void ExpectAbortOnlyByOwner(v1::Generation::Stub& owner, v1::Generation::Stub& other) {
  std::atomic<int> tokens{0};
  grpc::Status owner_status;
  std::thread stream([&] {
    v1::GenerateRequest req = testing::TokensRequest({1, 2, 3, 4}, 100000);
    req.set_request_id("job-1");
    req.set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = owner.Generate(&context, req);
    v1::GenerateResponse response;
    while (reader->Read(&response)) tokens += response.tokens_size();
    owner_status = reader->Finish();
  });
  auto abort = [](v1::Generation::Stub& stub) {
    grpc::ClientContext context;
    v1::AbortRequest req;
    req.set_request_id("job-1");
    v1::AbortResponse reply;
    EXPECT_TRUE(stub.Abort(&context, req, &reply).ok());
    return reply.found();
  };
  auto wait_for_tokens = [&](int more) {
    const int target = tokens + more;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (tokens < target && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return tokens >= target;
  };
  EXPECT_TRUE(wait_for_tokens(1));
  EXPECT_FALSE(abort(other));
  EXPECT_TRUE(wait_for_tokens(5)) << "the request stopped after another principal's abort";
  EXPECT_TRUE(abort(owner));
  stream.join();
  EXPECT_EQ(owner_status.error_code(), grpc::StatusCode::CANCELLED) << owner_status.error_message();
  EXPECT_LT(tokens, 100000);
}

testing::Streamed Generate(v1::Generation::Stub& stub, int max_tokens) {
  return testing::GenerateAll(stub, testing::TokensRequest({1, 2, 3, 4}, max_tokens), 120);
}

TEST_F(SecurityTest, TokensGuardBothPortsAndEachPortServesOnlyItsOwnServices) {
  auto coordinator = testing::StartServer(
      "coordinator --model " + K3Tiny() + " --metrics-port 0 --client-tokens-file " +
      File("clients") + " --worker-token-file " + File("workers"));
  ASSERT_FALSE(coordinator.worker_address.empty()) << coordinator.process->Log();
  ASSERT_NE(coordinator.worker_address, coordinator.address);
  auto alice = Client(coordinator.address, Token("alice"));
  auto anonymous = Client(coordinator.address, ChannelSecurity());
  auto wrong = Client(coordinator.address, Token("wrong"));

  // No token, a wrong token: UNAUTHENTICATED, on every Generation method.
  for (v1::Generation::Stub* stub : {anonymous.get(), wrong.get()}) {
    const grpc::Status status = StatusCall(*stub);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
    const testing::Streamed generated = Generate(*stub, 4);
    EXPECT_EQ(generated.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(generated.ids.empty());
  }
  EXPECT_NE(StatusCall(*anonymous).error_message().find("bearer token"), std::string::npos);
  EXPECT_TRUE(StatusCall(*alice).ok());

  // Health answers without a token (the documented rule): NOT_SERVING, since
  // no worker is attached yet.
  EXPECT_EQ(testing::Probe("health " + coordinator.address), "NOT_SERVING\n");

  // Workers without the worker token (none, or a client's) cannot attach.
  ExpectRefused(coordinator.worker_address, "", "worker-none.log", *alice,
                "refused this worker's credentials");
  ExpectRefused(coordinator.worker_address, "--worker-token-file " + File("alice"),
                "worker-client-token.log", *alice, "refused this worker's credentials");
  EXPECT_EQ(testing::Probe("health " + coordinator.address), "NOT_SERVING\n");

  // The client port has no WorkerLink, even for the right token.
  {
    ChannelSecurity with_worker_token = Token("workers");
    auto channel = OpenChannel(coordinator.address, with_worker_token, grpc::ChannelArguments());
    ASSERT_TRUE(channel.ok());
    auto link = v1::WorkerLink::NewStub(*channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = link->Attach(&context);
    v1::CoordinatorMessage message;
    EXPECT_FALSE(stream->Read(&message));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  // The worker port has no Generation (nor health, nor reflection).
  auto on_worker_port = Client(coordinator.worker_address, Token("alice"));
  EXPECT_EQ(StatusCall(*on_worker_port).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(Generate(*on_worker_port, 4).status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  const std::pair<std::string, std::string> probes[] = {{"health", ""},
                                                        {"services", "v1alpha"},
                                                        {"services", "v1"},
                                                        {"files", "v1 deltaserve.v1.Generation"}};
  for (const auto& [command, rest] : probes) {
    const std::string args = command + " " + coordinator.worker_address + " " + rest;
    EXPECT_NE(testing::Probe(args).find("UNIMPLEMENTED"), std::string::npos) << args;
  }

  // A worker with the token attaches and serves.
  auto worker = StartWorker(coordinator.worker_address, "--worker-token-file " + File("workers"),
                            "worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *alice, [](const v1::ServerStatus& s) { return s.workers() == 1; }, std::chrono::seconds(60)))
      << worker->Log();
  const testing::Streamed served = Generate(*alice, 8);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.ids.size(), 8u);
  // The Python example sends the token from --token-file.
  std::string output;
  EXPECT_EQ(PythonGenerate(coordinator.address, "--token-file " + File("bob"), &output), 0)
      << output;
  EXPECT_EQ(PythonGenerate(coordinator.address, "", &output), 1) << output;
  EXPECT_NE(output.find("UNAUTHENTICATED"), std::string::npos) << output;
  // So does `deltaserve batch --server`; without it the job stops, naming why.
  const std::string batch = testing::BinPath("deltaserve") + " batch --server " +
                            coordinator.address + " --retry-s 5 --quiet --input " +
                            File("in.jsonl");
  std::ofstream(File("in.jsonl")) << "{\"id\": \"b\", \"tokens\": [1, 2, 3], \"max_tokens\": 4}\n";
  EXPECT_EQ(
      testing::RunCommand(
          batch + " --output " + File("out.jsonl") + " --token-file " + File("alice"), &output),
      0)
      << output;
  EXPECT_NE(Slurp(File("out.jsonl")).find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(testing::RunCommand(batch + " --output " + File("refused.jsonl"), &output), 0);
  EXPECT_NE(output.find("refused this client"), std::string::npos) << output;

  // Only the announced ports listen: the client port, the worker port and
  // the metrics port.
  bool all_loopback = false;
  EXPECT_EQ(ListeningPorts(coordinator.process->pid(), &all_loopback),
            (std::set<int>{coordinator.port, std::stoi(coordinator.worker_address.substr(10)),
                           coordinator.metrics_port}));
  EXPECT_TRUE(all_loopback);
}

TEST_F(SecurityTest, ARequestIsAbortedOnlyByThePrincipalThatSentIt) {
  auto coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() + " --client-tokens-file " +
                           File("clients") + " --worker-token-file " + File("workers"));
  ASSERT_FALSE(coordinator.worker_address.empty()) << coordinator.process->Log();
  auto alice = Client(coordinator.address, Token("alice"));
  auto bob = Client(coordinator.address, Token("bob"));
  auto worker = StartWorker(coordinator.worker_address, "--worker-token-file " + File("workers"),
                            "worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *alice, [](const v1::ServerStatus& s) { return s.workers() == 1; }, std::chrono::seconds(60)))
      << worker->Log();

  ExpectAbortOnlyByOwner(*alice, *bob);
}

TEST_F(SecurityTest, MutualTlsOnBothPortsRefusesEveryPeerWithoutATrustedCertificate) {
  const std::string tls = " --tls-cert " + File("server.pem") + " --tls-key " + File("server.key") +
                          " --tls-client-ca " + File("ca.pem") + " --tls-worker-ca " +
                          File("worker-ca.pem");
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny() + tls);
  ASSERT_FALSE(coordinator.worker_address.empty()) << coordinator.process->Log();
  auto alice = Client(coordinator.address, Tls("ca", "alice"));
  v1::ServerStatus status;
  ASSERT_TRUE(StatusCall(*alice, &status).ok());
  // The certificate names localhost too: --tls-server-name picks the name.
  ChannelSecurity by_name = Tls("ca", "alice");
  by_name.server_name = "localhost";
  EXPECT_TRUE(StatusCall(*Client(coordinator.address, by_name)).ok());
  ChannelSecurity wrong_name = by_name;
  wrong_name.server_name = "coordinator.example";

  // Plaintext to a TLS port; TLS without a client certificate; a certificate
  // of a CA the server does not trust; a server certificate this client does
  // not trust, or that does not carry the name asked for: no call gets
  // through.
  for (const ChannelSecurity& refused :
       {ChannelSecurity(), Tls("ca"), Tls("ca", "mallory"), Tls("rogue-ca", "alice"), wrong_name}) {
    auto stub = Client(coordinator.address, refused);
    const grpc::Status s = StatusCall(*stub);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << refused.ca_file << " " << refused.cert_file << ": " << s.error_message();
  }

  // Workers: none without a certificate of the workers' CA; a client's
  // certificate is not one.
  const std::string ca = " --tls-ca " + File("ca.pem");
  // A plaintext worker is told at once that the port speaks TLS.
  const auto plain_start = std::chrono::steady_clock::now();
  ExpectRefused(coordinator.worker_address, "", "plain-worker.log", *alice,
                "speaks TLS and this worker connects in plaintext: give --tls-ca");
  EXPECT_LT(std::chrono::steady_clock::now() - plain_start, std::chrono::seconds(4));
  ExpectRefused(coordinator.worker_address, ca, "certless-worker.log", *alice, "cannot reach");
  ExpectRefused(coordinator.worker_address,
                ca + " --tls-cert " + File("mallory.pem") + " --tls-key " + File("mallory.key"),
                "rogue-worker.log", *alice, "cannot reach");
  ExpectRefused(coordinator.worker_address,
                ca + " --tls-cert " + File("alice.pem") + " --tls-key " + File("alice.key"),
                "client-cert-worker.log", *alice, "cannot reach");

  // One with it attaches, and a client with its certificate is served.
  auto worker = StartWorker(
      coordinator.worker_address,
      ca + " --tls-cert " + File("worker.pem") + " --tls-key " + File("worker.key"), "worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *alice, [](const v1::ServerStatus& s) { return s.workers() == 1; }, std::chrono::seconds(60)))
      << worker->Log();
  const testing::Streamed served = Generate(*alice, 8);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.ids.size(), 8u);
  // With certificates and no tokens, the certificate names the principal:
  // another certificate of the same CA cannot abort alice's request.
  ExpectAbortOnlyByOwner(*alice, *Client(coordinator.address, Tls("ca", "carol")));

  // The same with `deltaserve client` and the Python example.
  std::string output;
  const std::string client_cert =
      " --tls-cert " + File("alice.pem") + " --tls-key " + File("alice.key");
  EXPECT_EQ(PythonGenerate(coordinator.address, ca + client_cert, &output), 0) << output;
  EXPECT_EQ(PythonGenerate(coordinator.address, ca, &output), 1) << output;
  EXPECT_NE(output.find("UNAVAILABLE"), std::string::npos) << output;
  EXPECT_EQ(testing::RunCommand(testing::BinPath("deltaserve") + " client generate --server " +
                                    coordinator.address + ca + client_cert +
                                    " --tokens 1,2,3 --max-tokens 4 --ids",
                                &output),
            0)
      << output;
  EXPECT_EQ(testing::RunCommand(
                testing::BinPath("deltaserve") + " client status --server " + coordinator.address,
                &output),
            1)
      << output;
  EXPECT_NE(output.find("UNAVAILABLE"), std::string::npos) << output;
}

// One CA for clients and workers would let any client certificate attach as
// a worker and read every prompt: the server refuses to start that way (the
// same file, or a copy) unless workers also need a token.
TEST_F(SecurityTest, OneCaForClientsAndWorkersNeedsWorkerTokens) {
  // The same CA as a copy, re-encoded (with its text dump before it), in a
  // bundle after the worker CA, and reissued with its key under another
  // name: each would let a client certificate attach as a worker, and each
  // but the copy was once taken, not being byte for byte the client CA file.
  std::filesystem::copy_file(File("ca.pem"), File("ca-copy.pem"),
                             std::filesystem::copy_options::overwrite_existing);
  const std::string& d = *dir_;
  Shell("cd " + d + " && openssl x509 -in ca.pem -text -out ca-text.pem 2>&1");
  Shell("cd " + d + " && cat worker-ca.pem ca.pem > bundle.pem");
  Shell("cd " + d +
        " && openssl req -x509 -key ca.key -days 2 -subj /CN=deltaserve-test-ca-reissued "
        "-out ca-reissued.pem 2>&1");
  const std::string tls = " --tls-cert " + File("server.pem") + " --tls-key " + File("server.key") +
                          " --tls-client-ca " + File("ca.pem");
  for (const std::string& worker_ca : {File("ca.pem"), File("ca-copy.pem"), File("ca-text.pem"),
                                       File("bundle.pem"), File("ca-reissued.pem")}) {
    std::string output;
    // A coordinator that starts would serve until killed: `timeout` ends it.
    EXPECT_EQ(testing::RunCommand("timeout 60 " + testing::BinPath("deltaserve") +
                                      " coordinator --model " + K3Tiny() + tls +
                                      " --tls-worker-ca " + worker_ca,
                                  &output),
              1)
        << worker_ca << ": " << output;
    EXPECT_NE(output.find("share a CA (CN=deltaserve-test-ca; the same certificate or key): any "
                          "client certificate it signs could attach as a worker and read every "
                          "prompt"),
              std::string::npos)
        << worker_ca << ": " << output;
  }
  auto coordinator =
      testing::StartServer("coordinator --model " + K3Tiny() + tls + " --tls-worker-ca " +
                           File("ca.pem") + " --worker-token-file " + File("workers"));
  ASSERT_FALSE(coordinator.worker_address.empty()) << coordinator.process->Log();
}

// With or without client certificates, a TLS port is the HTTP/2 guard's,
// which terminates TLS and reads the frames (h2_guard.h): the server serves
// either way and no longer warns that gRPC's parser is exposed. A key that
// is not the certificate's is refused, naming both files.
TEST_F(SecurityTest, TlsPortsServeBehindTheGuardWithOrWithoutClientCertificates) {
  const std::string tls = " --tls-cert " + File("server.pem") + " --tls-key " + File("server.key");
  const std::string tokens =
      " --client-tokens-file " + File("clients") + " --worker-token-file " + File("workers");
  for (const std::string& flags :
       {tls + tokens, tls + tokens + " --tls-client-ca " + File("ca.pem"),
        tls + " --tls-client-ca " + File("ca.pem") + " --tls-worker-ca " + File("worker-ca.pem")}) {
    auto coordinator = testing::StartServer("coordinator --model " + K3Tiny() + flags);
    ASSERT_FALSE(coordinator.worker_address.empty()) << coordinator.process->Log();
    ChannelSecurity security = Tls("ca", "alice");
    security.token_file = File("alice");
    EXPECT_TRUE(StatusCall(*Client(coordinator.address, security)).ok()) << flags;
    const std::string log = coordinator.process->Log();
    EXPECT_EQ(log.find("warning: TLS"), std::string::npos) << log;
  }
  // A key that is not the certificate's: TlsMistakesAreNamedAtStart.
}

// The HTTP API on the client port's TLS: curl trusting the test CA is
// served with the token (an API key) or, under mutual TLS, a certificate of
// the client CA; without them, or in plaintext, it is not.
TEST_F(SecurityTest, TheHttpApiHasTheClientPortsTlsAndTokens) {
  const std::string tls = " --tls-cert " + File("server.pem") + " --tls-key " + File("server.key");
  const std::string curl = "curl -s -o /dev/null -w '%{http_code}' --cacert " + File("ca.pem");
  auto get = [&](int port, const std::string& flags) {
    std::string out;
    testing::RunCommand(
        absl::StrCat(curl, " ", flags, " https://127.0.0.1:", port, "/v1/models 2>&1"), &out);
    return out;
  };
  {
    auto server =
        testing::StartServer("serve --model " + K3Tiny() + tls + " --client-tokens-file " +
                             File("clients") + " --http-port 0");
    ASSERT_GE(server.http_port, 0) << server.process->Log();
    EXPECT_EQ(get(server.http_port, "-H 'Authorization: Bearer alice-0123456789abcdef'"), "200");
    EXPECT_EQ(get(server.http_port, "-H 'Authorization: Bearer not-a-token-of-this-server'"),
              "401");
    EXPECT_EQ(get(server.http_port, ""), "401");
    // Plaintext HTTP to the TLS port gets no answer.
    std::string out;
    testing::RunCommand(absl::StrCat("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:",
                                     server.http_port, "/v1/models"),
                        &out);
    EXPECT_EQ(out, "000");
  }
  auto server = testing::StartServer("serve --model " + K3Tiny() + tls + " --tls-client-ca " +
                                     File("ca.pem") + " --http-port 0");
  ASSERT_GE(server.http_port, 0) << server.process->Log();
  const std::string alice = " --cert " + File("alice.pem") + " --key " + File("alice.key");
  EXPECT_EQ(get(server.http_port, alice), "200");
  // No certificate, or one of a CA the server does not trust: no HTTP at all.
  EXPECT_EQ(get(server.http_port, ""), "000");
  EXPECT_EQ(
      get(server.http_port, " --cert " + File("mallory.pem") + " --key " + File("mallory.key")),
      "000");
}

TEST_F(SecurityTest, AHeaderFloodGetsAnErrorAndTheServerServesOn) {
  // A header list limit below gRPC's default of 8 KiB, so that the refusal
  // of 6 KiB shows the flag reaches the transport. 1 MiB is past what the
  // HTTP/2 guard lets through to gRPC (twice the limit plus 16 KiB): the
  // connection is closed in the middle of the block (UNAVAILABLE).
  auto server = testing::StartServer("serve --model " + K3Tiny() +
                                     " --threads 1 --max-metadata-bytes 4096 --metrics-port 0");
  ASSERT_NE(server.stub, nullptr);
  for (const size_t bytes : {size_t{6} << 10, size_t{1} << 20}) {
    auto stub = Client(server.address, ChannelSecurity());
    grpc::ClientContext context;
    context.AddMetadata("x-flood", std::string(bytes, 'a'));
    v1::ServerStatus status;
    const grpc::Status flooded =
        stub->GetServerStatus(&context, v1::GetServerStatusRequest(), &status);
    EXPECT_EQ(flooded.error_code(), bytes < (16 << 10) ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                                       : grpc::StatusCode::UNAVAILABLE)
        << bytes << ": " << flooded.error_message();
  }
  EXPECT_NE(testing::HttpGet(server.metrics_port, "/metrics")
                .find("deltaserve_http2_connections_cut_total 1\n"),
            std::string::npos);
  // Metadata within the limit passes, and the server goes on serving.
  auto fresh = Client(server.address, ChannelSecurity());
  grpc::ClientContext context;
  context.AddMetadata("x-small", std::string(1024, 'a'));
  v1::ServerStatus status;
  EXPECT_TRUE(fresh->GetServerStatus(&context, v1::GetServerStatusRequest(), &status).ok());
  const testing::Streamed served = Generate(*fresh, 4);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.ids.size(), 4u);
}

// The mode of `path`'s permission bits, -1 when it does not exist.
int Mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
}

// A coordinator given no worker credentials makes a worker token: written
// mode 600 beside its port file and in this user's runtime directory, where
// a `deltaserve worker` of the same user finds it with no flags; a link
// without it is refused. --insecure-workers keeps the port open.
TEST_F(SecurityTest, WithoutWorkerCredentialsTheCoordinatorMakesAWorkerToken) {
  const std::string runtime = *dir_ + "/runtime";
  fs::create_directories(runtime);
  ASSERT_EQ(setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1), 0);
  auto coordinator = testing::StartServer("coordinator --model " + K3Tiny());
  ASSERT_FALSE(coordinator.worker_address.empty()) << coordinator.process->Log();
  const std::string port = coordinator.worker_address.substr(10);
  const std::string in_runtime = runtime + "/deltaserve/worker-token-" + port;
  EXPECT_EQ(Mode(coordinator.worker_token_file), 0600) << coordinator.process->Log();
  EXPECT_EQ(Mode(in_runtime), 0600) << coordinator.process->Log();
  EXPECT_EQ(Mode(runtime + "/deltaserve"), 0700);
  const std::string token = Slurp(in_runtime);
  EXPECT_EQ(token.size(), 65u) << token;  // 256 bits in hex, a line
  EXPECT_EQ(Slurp(coordinator.worker_token_file), token);
  EXPECT_NE(coordinator.process->Log().find("workers must send the worker token in"),
            std::string::npos)
      << coordinator.process->Log();

  // A link without the token (another user's process) is refused.
  auto status_of = [](const std::shared_ptr<grpc::Channel>& channel) {
    auto link = v1::WorkerLink::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = link->Attach(&context);
    v1::CoordinatorMessage message;
    while (stream->Read(&message)) {
    }
    return stream->Finish();
  };
  EXPECT_EQ(
      status_of(grpc::CreateChannel(coordinator.worker_address, grpc::InsecureChannelCredentials()))
          .error_code(),
      grpc::StatusCode::UNAUTHENTICATED);

  // A worker of this user with no flags reads it and attaches.
  auto worker = StartWorker(coordinator.worker_address, "", "default-token-worker.log");
  ASSERT_TRUE(testing::WaitForStatus(
      *coordinator.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
      std::chrono::seconds(60)))
      << worker->Log() << coordinator.process->Log();
  EXPECT_NE(worker->Log().find("using the coordinator's worker token in " + in_runtime),
            std::string::npos)
      << worker->Log();
  const testing::Streamed served = Generate(*coordinator.stub, 4);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();

  // Its files go with it.
  coordinator.process->Signal(SIGTERM);
  EXPECT_EQ(coordinator.process->Wait(std::chrono::seconds(30)), 0) << coordinator.process->Log();
  EXPECT_FALSE(fs::exists(in_runtime));
  EXPECT_FALSE(fs::exists(coordinator.worker_token_file));
  worker->Wait(std::chrono::seconds(30));

  // --insecure-workers: no token, and a link without one attaches.
  auto open = testing::StartServer("coordinator --model " + K3Tiny() + " --insecure-workers");
  ASSERT_FALSE(open.worker_address.empty()) << open.process->Log();
  EXPECT_FALSE(fs::exists(open.worker_token_file));
  EXPECT_FALSE(fs::exists(runtime + "/deltaserve/worker-token-" + open.worker_address.substr(10)));
  {
    auto link = v1::WorkerLink::NewStub(
        grpc::CreateChannel(open.worker_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    auto stream = link->Attach(&context);
    auto config = LoadModelConfig(K3Tiny());
    ASSERT_TRUE(config.ok());
    v1::WorkerMessage hello;
    *hello.mutable_hello() = MakeWorkerHello(*config, *WorldLayout::Make(1, 1, 1), "open");
    ASSERT_TRUE(stream->Write(hello));
    EXPECT_TRUE(testing::WaitForStatus(
        *open.stub, [](const v1::ServerStatus& s) { return s.workers() == 1; },
        std::chrono::seconds(10)));
    context.TryCancel();
  }
}

// TLS mistakes are named at start: a key that is not the certificate's, a
// client CA without a certificate (about clients, whatever the workers
// have), and a certificate past its notAfter (a warning naming it).
TEST_F(SecurityTest, TlsMistakesAreNamedAtStart) {
  const std::string base = testing::BinPath("deltaserve") + " coordinator --model " + K3Tiny() +
                           " --port 0 --worker-port 0";
  std::string output;
  EXPECT_EQ(testing::RunCommand(base + " --tls-cert " + File("server.pem") + " --tls-key " +
                                    File("alice.key") + " 2>&1",
                                &output),
            1)
      << output;
  EXPECT_NE(output.find("--tls-key " + File("alice.key") +
                        " is not the key of the certificate in --tls-cert " + File("server.pem")),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("cannot listen"), std::string::npos) << output;

  EXPECT_EQ(testing::RunCommand(base + " --tls-client-ca " + File("ca.pem") + " 2>&1", &output), 1)
      << output;
  EXPECT_NE(output.find("a client CA (mutual TLS) needs the server's own --tls-cert"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("workers"), std::string::npos) << output;

  // A server certificate that ended in 2020, signed with openssl ca (x509
  // -req takes no dates in the past).
  const std::string& d = *dir_;
  Shell("cd " + d +
        " && mkdir -p old-ca/certs && : >old-ca/index.txt && echo 01 >old-ca/serial && " +
        "printf '[ca]\ndefault_ca=d\n[d]\ndir=old-ca\ndatabase=$dir/index.txt\n"
        "new_certs_dir=$dir/certs\nserial=$dir/serial\ndefault_md=sha256\npolicy=p\n"
        "[p]\ncommonName=supplied\n' >old-ca.cnf && "
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout old.key "
        "-out old.csr -subj /CN=old 2>&1 && chmod 600 old.key && "
        "openssl ca -batch -config old-ca.cnf -cert ca.pem -keyfile ca.key -in old.csr -out "
        "old.pem -startdate 20200101000000Z -enddate 20200102000000Z -notext 2>&1");
  auto expired = testing::StartServer("coordinator --model " + K3Tiny() + " --tls-cert " +
                                      File("old.pem") + " --tls-key " + File("old.key"));
  ASSERT_NE(expired.process, nullptr);
  EXPECT_NE(expired.process->Log().find("the certificate in --tls-cert " + File("old.pem") +
                                        " expired at Jan  2 00:00:00 2020 GMT (notAfter)"),
            std::string::npos)
      << expired.process->Log();
}

// A host other than loopback with nothing to authenticate is refused, with
// a message naming what to give; --insecure or credentials let it start.
TEST_F(SecurityTest, ANonLoopbackHostNeedsTlsOrTokensOrInsecure) {
  const std::string base = testing::BinPath("deltaserve") + " coordinator --model " + K3Tiny() +
                           " --host 0.0.0.0 --port 0 --worker-port 0";
  std::string output;
  EXPECT_EQ(testing::RunCommand(base, &output), 1) << output;
  EXPECT_NE(output.find("--host 0.0.0.0 is not a loopback address"), std::string::npos) << output;
  EXPECT_NE(output.find("--insecure"), std::string::npos) << output;
  // Tokens for clients but none for workers (when it makes none) is
  // refused too.
  EXPECT_EQ(testing::RunCommand(
                base + " --insecure-workers --client-tokens-file " + File("clients"), &output),
            1)
      << output;
  EXPECT_NE(output.find("--worker-token-file"), std::string::npos) << output;
  // A token file others can read is refused, naming the fix.
  const std::string open_file = File("open-tokens");
  std::ofstream(open_file) << "carol:carol-0123456789abcdef\n";
  chmod(open_file.c_str(), 0644);
  EXPECT_EQ(testing::RunCommand(base + " --client-tokens-file " + open_file +
                                    " --worker-token-file " + File("workers"),
                                &output),
            1)
      << output;
  EXPECT_NE(output.find("chmod 600"), std::string::npos) << output;

  // With no --host at all, every port (gRPC and metrics) binds loopback.
  {
    const std::string port_file = *dir_ + "/default-port";
    auto server = testing::ChildProcess::Start(
        testing::BinPath("deltaserve") + " coordinator --model " + K3Tiny() +
            " --port 0 --worker-port 0 --metrics-port 0 --port-file " + port_file,
        *dir_ + "/default.log");
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(port_file) && std::chrono::steady_clock::now() < end &&
           !server->Wait(std::chrono::milliseconds(20))) {
    }
    ASSERT_TRUE(fs::exists(port_file)) << server->Log();
    bool all_loopback = false;
    EXPECT_EQ(ListeningPorts(server->pid(), &all_loopback).size(), 3u);
    EXPECT_TRUE(all_loopback);
  }

  for (const std::string& flags :
       {std::string(" --insecure"),
        " --client-tokens-file " + File("clients") + " --worker-token-file " + File("workers")}) {
    const std::string port_file = *dir_ + "/exposed-port";
    fs::remove(port_file);
    auto server = testing::ChildProcess::Start(base + flags + " --port-file " + port_file,
                                               *dir_ + "/exposed.log");
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(port_file) && std::chrono::steady_clock::now() < end &&
           !server->Wait(std::chrono::milliseconds(20))) {
    }
    EXPECT_TRUE(fs::exists(port_file)) << flags << ": " << server->Log();
    // Its two gRPC ports bind every address, as asked.
    bool all_loopback = true;
    EXPECT_EQ(ListeningPorts(server->pid(), &all_loopback).size(), 2u);
    EXPECT_FALSE(all_loopback);
    server->Signal(SIGTERM);
    EXPECT_EQ(server->Wait(std::chrono::seconds(30)), 0) << server->Log();
  }
}

}  // namespace
}  // namespace deltaserve
