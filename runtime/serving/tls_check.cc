#include "runtime/serving/tls_check.h"

#include <netdb.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/common/file_util.h"
#include "runtime/common/log.h"
#include "runtime/common/status_macros.h"
#include "runtime/serving/auth.h"

namespace deltaserve {
namespace {

constexpr int64_t kMaxPemBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};

std::unique_ptr<BIO, BioFree> Memory(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// "Jan  2 00:00:00 2020 GMT".
std::string TimeText(const ASN1_TIME* time) {
  std::unique_ptr<BIO, BioFree> out(BIO_new(BIO_s_mem()));
  if (out == nullptr || ASN1_TIME_print(out.get(), time) != 1) return "?";
  char* data = nullptr;
  const long length = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(length));
}

// Every certificate of a PEM bundle (a CA file), in order; an error naming
// `flag` and `path` when it cannot be read or holds none.
absl::StatusOr<std::vector<std::unique_ptr<X509, X509Free>>> ReadCertificates(
    const std::string& path, const std::string& flag) {
  DELTASERVE_ASSIGN_OR_RETURN(std::string pem, ReadRegularFile(path, kMaxPemBytes));
  auto bio = Memory(pem);
  std::vector<std::unique_ptr<X509, X509Free>> certs;
  while (bio != nullptr) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (cert == nullptr) break;
    certs.emplace_back(cert);
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": holds no PEM certificate"));
  }
  return certs;
}

// "CN=..., O=..." of a certificate's subject, for a message.
std::string SubjectText(const X509* cert) {
  std::unique_ptr<BIO, BioFree> out(BIO_new(BIO_s_mem()));
  if (out == nullptr ||
      X509_NAME_print_ex(out.get(), X509_get_subject_name(cert), 0, XN_FLAG_RFC2253) < 0) {
    return "?";
  }
  char* data = nullptr;
  const long length = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(std::min<long>(length, 256)));
}

}  // namespace

absl::Status CheckCaFilesShareNoCa(const std::string& client_ca_file,
                                   const std::string& worker_ca_file) {
  DELTASERVE_ASSIGN_OR_RETURN(auto clients, ReadCertificates(client_ca_file, "--tls-client-ca"));
  DELTASERVE_ASSIGN_OR_RETURN(auto workers, ReadCertificates(worker_ca_file, "--tls-worker-ca"));
  for (const auto& client : clients) {
    const EVP_PKEY* client_key = X509_get0_pubkey(client.get());
    for (const auto& worker : workers) {
      const EVP_PKEY* worker_key = X509_get0_pubkey(worker.get());
      const bool same = X509_cmp(client.get(), worker.get()) == 0 ||
                        (client_key != nullptr && worker_key != nullptr &&
                         EVP_PKEY_eq(client_key, worker_key) == 1);
      ERR_clear_error();
      if (!same) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls-client-ca ", client_ca_file, " and --tls-worker-ca ", worker_ca_file,
          " share a CA (", SubjectText(client.get()),
          "; the same certificate or key): any client certificate it signs could attach as a "
          "worker and read every prompt; give workers a CA of their own, or a "
          "--worker-token-file as well"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckServerCertificate(const ServerTls& tls) {
  if (tls.cert_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> cert_pem = ReadRegularFile(tls.cert_file, kMaxPemBytes);
  if (!cert_pem.ok()) return absl::OkStatus();
  auto cert_bio = Memory(*cert_pem);
  std::unique_ptr<X509, X509Free> cert(
      cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (cert == nullptr) return absl::OkStatus();
  const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
  const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
  if (X509_cmp_current_time(not_after) < 0) {
    log::Warning("server", absl::StrCat("the certificate in --tls-cert ", tls.cert_file,
                                        " expired at ", TimeText(not_after),
                                        " (notAfter): clients and workers that verify it will "
                                        "refuse to connect"));
  } else if (X509_cmp_current_time(not_before) > 0) {
    log::Warning("server", absl::StrCat("the certificate in --tls-cert ", tls.cert_file,
                                        " is not valid before ", TimeText(not_before),
                                        " (notBefore; it ends at ", TimeText(not_after),
                                        "): clients and workers that verify it will refuse to "
                                        "connect until then"));
  }
  return absl::OkStatus();
}

bool SpeaksTls(const std::string& target, std::chrono::milliseconds timeout) {
  // host:port, with dns:/// or ipv4: / ipv6: in front, [v6] in brackets.
  absl::string_view rest = target;
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&rest, scheme)) break;
  }
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return false;
  std::string host(rest.substr(0, colon));
  const std::string port(rest.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return false;
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct Closer {
    int fd;
    addrinfo* found;
    ~Closer() {
      if (fd >= 0) ::close(fd);
      ::freeaddrinfo(found);
    }
  } closer{fd, found};
  if (fd < 0) return false;
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0) return false;
  // OpenSSL writes the ClientHello into memory; the answer's first bytes
  // say whether a TLS server read it.
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return false;
  SSL* ssl = SSL_new(ctx);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  std::string hello;
  if (ssl != nullptr && in != nullptr && out != nullptr) {
    SSL_set_bio(ssl, in, out);  // owned by ssl from here
    in = out = nullptr;
    SSL_set_connect_state(ssl);
    SSL_do_handshake(ssl);
    char* data = nullptr;
    const long length = BIO_get_mem_data(SSL_get_wbio(ssl), &data);
    if (length > 0) hello.assign(data, static_cast<size_t>(length));
  }
  BIO_free(in);
  BIO_free(out);
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ERR_clear_error();
  if (hello.empty() ||
      ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
    return false;
  }
  unsigned char answer[2];
  size_t got = 0;
  while (got < sizeof(answer)) {
    const ssize_t n = ::recv(fd, answer + got, sizeof(answer) - got, 0);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  // A handshake (22) or alert (21) record of TLS (major version 3).
  return (answer[0] == 22 || answer[0] == 21) && answer[1] == 3;
}

}  // namespace deltaserve
