// Token files, token lookup, request-id scopes and loopback addresses
// (runtime/serving/auth.h): what is accepted, and each refusal naming the
// file, the line and the fix. The identity a client certificate gives
// (runtime/serving/credentials.h), as gRPC's AuthContext gave it.
#include "runtime/serving/auth.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"
#include "runtime/serving/credentials.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

std::string Write(const std::string& text, mode_t mode = 0600) {
  static int n = 0;
  const std::string path = testing::TempDir("auth") + "/tokens" + std::to_string(n++);
  std::ofstream(path) << text;
  EXPECT_EQ(chmod(path.c_str(), mode), 0);
  return path;
}

TEST(TokenFileTest, ReadsPrincipalsTokensCommentsAndBareTokens) {
  const std::string path = Write(
      "# clients\n\nalice:alice-0123456789abcdef\n  bob@lab:b0b-0123456789ABCDEF+/==  \n"
      "bare-token-0123456789\n");
  auto entries = ReadTokenFile(path);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].principal, "alice");
  EXPECT_EQ((*entries)[0].token, "alice-0123456789abcdef");
  EXPECT_EQ((*entries)[1].principal, "bob@lab");
  EXPECT_EQ((*entries)[1].token, "b0b-0123456789ABCDEF+/==");
  EXPECT_EQ((*entries)[2].principal, "line-5");
  auto first = ReadBearerToken(path);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, "alice-0123456789abcdef");
}

TEST(TokenFileTest, RefusesWhatCouldBeMisreadOrLeaked) {
  struct Case {
    std::string text;
    mode_t mode;
    std::string error;
  };
  const Case cases[] = {
      {"alice:alice-0123456789abcdef\n", 0644, "chmod 600"},
      {"alice:alice-0123456789abcdef\n", 0620, "chmod 600"},
      {"# nothing\n\n", 0600, "holds no token"},
      {"alice:short\n", 0600, "line 1: a token of 5 bytes"},
      {"alice:" + std::string(257, 'a') + "\n", 0600, "a token of 257 bytes"},
      {"alice:has space in it 0123456789\n", 0600, "letters, digits and -._~+/"},
      {"al ice:alice-0123456789abcdef\n", 0600, "a principal is"},
      {":alice-0123456789abcdef\n", 0600, "a principal is"},
      {"a/b:alice-0123456789abcdef\n", 0600, "a principal is"},
      {"a:alice-0123456789abcdef\na:bob-0123456789abcdef0\n", 0600, "line 2: principal 'a'"},
      {"a:alice-0123456789abcdef\nb:alice-0123456789abcdef\n", 0600, "same token is listed twice"},
  };
  for (const Case& c : cases) {
    const std::string path = Write(c.text, c.mode);
    auto entries = ReadTokenFile(path);
    ASSERT_FALSE(entries.ok()) << c.text;
    EXPECT_NE(entries.status().message().find(c.error), std::string::npos)
        << entries.status() << " for " << c.text;
    EXPECT_NE(entries.status().message().find(path), std::string::npos) << entries.status();
  }
  EXPECT_FALSE(ReadTokenFile("/nonexistent/tokens").ok());
  // A directory and a device are not token files.
  EXPECT_NE(ReadTokenFile(testing::TempDir("auth")).status().message().find("not a regular file"),
            std::string::npos);
  EXPECT_FALSE(ReadTokenFile("/dev/zero").ok());
}

TEST(TokenSetTest, FindsExactlyTheTokenAndItsPrincipal) {
  TokenSet set({{"alice", "alice-0123456789abcdef"}, {"bob", "bob-0123456789abcdef0"}});
  EXPECT_EQ(set.Find("alice-0123456789abcdef"), "alice");
  EXPECT_EQ(set.Find("bob-0123456789abcdef0"), "bob");
  // Prefixes, extensions, one changed byte, empty, over-long: nobody.
  EXPECT_EQ(set.Find("alice-0123456789abcde"), std::nullopt);
  EXPECT_EQ(set.Find("alice-0123456789abcdef0"), std::nullopt);
  EXPECT_EQ(set.Find("alice-0123456789abcdeF"), std::nullopt);
  EXPECT_EQ(set.Find(""), std::nullopt);
  EXPECT_EQ(set.Find(std::string(1000, 'a')), std::nullopt);
  // A token that is the other padded with NULs is not it.
  EXPECT_EQ(set.Find(std::string("bob-0123456789abcdef0\0", 22)), std::nullopt);
}

TEST(RequestScopeTest, PrincipalsNeverShareARequestId) {
  EXPECT_EQ(ScopedRequestId("", "req-1"), "req-1");
  EXPECT_EQ(ScopedRequestId("alice", "req-1"), "alice/req-1");
  EXPECT_NE(ScopedRequestId("alice", "req-1"), ScopedRequestId("bob", "req-1"));
  // No principal contains '/' (ReadTokenFile refuses one), so a request id
  // with '/' stays inside its principal's scope.
  EXPECT_EQ(ScopedRequestId("alice", "bob/req-1"), "alice/bob/req-1");
}

// The status lists a principal's requests by the ids it gave, and no
// other principal's, even one whose name starts the same or an id that
// looks scoped.
TEST(RequestScopeTest, APrincipalOwnsOnlyTheIdsOfItsScope) {
  EXPECT_EQ(OwnRequestId("alice", ScopedRequestId("alice", "req-1")), "req-1");
  EXPECT_EQ(OwnRequestId("alice", ScopedRequestId("alice", "bob/req-1")), "bob/req-1");
  EXPECT_EQ(OwnRequestId("alice", ScopedRequestId("bob", "req-1")), std::nullopt);
  EXPECT_EQ(OwnRequestId("alice", ScopedRequestId("alice2", "req-1")), std::nullopt);
  EXPECT_EQ(OwnRequestId("alice", ScopedRequestId("", "alice")), std::nullopt);
  EXPECT_EQ(OwnRequestId("alice", "alice/"), std::nullopt);
  // No authentication: one namespace, every id the caller's.
  EXPECT_EQ(OwnRequestId("", "req-1"), "req-1");
  EXPECT_EQ(OwnRequestId("", "alice/req-1"), "alice/req-1");
}

TEST(LoopbackTest, OnlyLoopbackAddressesAreLoopback) {
  for (const char* host :
       {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "::", "[::]", "10.0.0.5", "128.0.0.1", "example.com",
                           "localhost.example.com", "", "::ffff:10.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

// A self-signed certificate with `subject` and, if not empty, the
// subjectAltName `san` (openssl's syntax): its identity.
std::string IdentityOf(const std::string& subject, const std::string& san) {
  const std::string dir = testing::TempDir("cert");
  std::string command = "cd " + dir +
                        " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                        "-nodes -keyout key.pem -out cert.pem -days 1 -subj " +
                        subject;
  if (!san.empty()) command += " -addext subjectAltName=" + san;
  std::string output;
  EXPECT_EQ(testing::RunCommand(command + " 2>&1", &output), 0) << output;
  std::FILE* f = std::fopen((dir + "/cert.pem").c_str(), "r");
  if (f == nullptr) return "(no certificate)";
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  const std::string identity = CertificateIdentity(cert);
  X509_free(cert);
  return identity;
}

// The first subject alternative name of the kinds gRPC reads (DNS, URI,
// e-mail, IP address), in the certificate's order, else the common name.
TEST(CertificateIdentityTest, IsTheFirstSubjectAltNameElseTheCommonName) {
  EXPECT_EQ(IdentityOf("/CN=alice", ""), "cn:alice");
  EXPECT_EQ(IdentityOf("/O=org/CN=alice", "DNS:worker-1.example,IP:10.0.0.1"),
            "dns:worker-1.example");
  EXPECT_EQ(IdentityOf("/CN=alice", "IP:10.0.0.1,DNS:worker-1.example"), "ip:10.0.0.1");
  EXPECT_EQ(IdentityOf("/CN=alice", "IP:2001:db8::1"), "ip:2001:db8::1");
  EXPECT_EQ(IdentityOf("/CN=alice", "URI:spiffe://example/worker"), "uri:spiffe://example/worker");
  EXPECT_EQ(IdentityOf("/CN=alice", "email:alice@example.org"), "email:alice@example.org");
  // A common name and a SAN of the same text are different peers.
  EXPECT_EQ(IdentityOf("/CN=alice.example", ""), "cn:alice.example");
  EXPECT_EQ(IdentityOf("/CN=other", "DNS:alice.example"), "dns:alice.example");
  EXPECT_EQ(IdentityOf("/O=only-an-organisation", ""), "");
  EXPECT_EQ(CertificateIdentity(nullptr), "");
}

// Certificate identities as principals never collide: not when they differ
// only in a character outside the principal alphabet, nor past a length
// limit, nor across kinds of name (each once ran as the same principal and
// could see and abort the other's requests).
TEST(CertificatePrincipalTest, DistinctIdentitiesAreDistinctPrincipals) {
  EXPECT_EQ(CertificatePrincipal("cn:alice"), "x509:cn:alice");
  EXPECT_EQ(CertificatePrincipal("cn:alice cert"), "x509:cn:alice_20cert");
  EXPECT_EQ(CertificatePrincipal("cn:alice_cert"), "x509:cn:alice_5fcert");
  EXPECT_EQ(CertificatePrincipal("uri:spiffe://example/w"), "x509:uri:spiffe:_2f_2fexample_2fw");
  const std::string spiffe =
      "uri:spiffe://cluster.example/ns/production/sa/" + std::string(80, 'x');
  std::vector<std::string> identities = {"cn:alice cert",
                                         "cn:alice_cert",
                                         "cn:alice/cert",
                                         "cn:alice_2Fcert",
                                         "cn:alice.example",
                                         "dns:alice.example",
                                         "cn:Alice",
                                         "cn:alice#",
                                         spiffe + "-one",
                                         spiffe + "-two",
                                         spiffe + "/one",
                                         spiffe + "_2Fone",
                                         "cn:" + std::string(200, '/'),
                                         "cn:" + std::string(201, '/'),
                                         std::string("cn:\xff\0z", 6)};
  std::set<std::string> principals;
  for (const std::string& identity : identities) {
    const std::string principal = CertificatePrincipal(identity);
    EXPECT_LE(principal.size(), kMaxCertificatePrincipalBytes) << identity;
    EXPECT_EQ(principal.find('/'), std::string::npos) << principal;
    for (const char c : principal) {
      EXPECT_TRUE(absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                  absl::string_view("-.@:_#").find(c) != absl::string_view::npos)
          << principal;
    }
    EXPECT_TRUE(principals.insert(principal).second) << identity << " -> " << principal;
  }
  // A long one keeps its start, then a hash.
  const std::string long_one = CertificatePrincipal(spiffe + "-one");
  EXPECT_EQ(long_one.rfind("x509:uri:spiffe:_2f_2fcluster.example_2fns", 0), 0u) << long_one;
  EXPECT_EQ(long_one.size(), kMaxCertificatePrincipalBytes);
  EXPECT_EQ(long_one[long_one.size() - 33], '#') << long_one;
  // The authenticator runs a certificate's call as it.
  const Authenticator auth(std::nullopt, /*client_certs=*/true);
  EXPECT_EQ(*auth.Authenticate(std::nullopt, std::string("cn:alice cert")), "x509:cn:alice_20cert");
}

}  // namespace
}  // namespace deltaserve
