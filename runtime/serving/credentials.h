// TLS and bearer tokens on gRPC's two ends: the TLS a listener of the
// coordinator serves with (terminated by its HTTP/2 guard), and the channel
// a client, `deltaserve batch`, bench-serve or a worker opens to it (TLS if
// asked, and the token on every call). docs/security.md says which flag
// sets which field.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

// OpenSSL's types, declared as <openssl/types.h> does.
struct ssl_ctx_st;
struct x509_st;

namespace deltaserve {

// A listener's TLS: PEM files; all empty is plaintext.
struct ServerTls {
  std::string cert_file;       // the certificate chain the server presents
  std::string key_file;        // its private key (mode 600)
  std::string client_ca_file;  // non-empty: mutual TLS, peers need a cert this CA signed
};

// The application protocol a TLS listener speaks (ALPN): HTTP/2 for the
// gRPC ports, HTTP/1.1 for the HTTP API.
enum class TlsProtocol { kHttp2, kHttp11 };

// A listener's TLS, loaded once: the HTTP/2 guard in front of each gRPC port
// terminates TLS itself with it (h2_guard.h says why), as the HTTP API does,
// so every handshake shares one certificate, key and client CA store. TLS
// 1.2 and 1.3, ALPN "h2" (or "http/1.1"), no session resumption (nothing to cache per client), and
// with a client CA a certificate it signed is required and verified.
class ServerTlsContext {
 public:
  ~ServerTlsContext();
  ServerTlsContext(const ServerTlsContext&) = delete;
  ServerTlsContext& operator=(const ServerTlsContext&) = delete;

  // OpenSSL's SSL_CTX, for SSL_new.
  ssl_ctx_st* get() const { return ctx_; }
  // Whether peers must present a certificate of the client CA (mutual TLS).
  bool client_certs() const { return client_certs_; }

 private:
  friend absl::StatusOr<std::shared_ptr<const ServerTlsContext>> MakeServerTls(
      const ServerTls& tls, TlsProtocol protocol);
  ServerTlsContext(ssl_ctx_st* ctx, bool client_certs) : ctx_(ctx), client_certs_(client_certs) {}
  ssl_ctx_st* const ctx_;
  const bool client_certs_;
  std::string alpn_;  // the protocol, as ALPN's wire form: its length, then its name
};

// nullptr (plaintext) when `tls` names no files; refused, naming the file,
// when a file cannot be read or holds no certificate or key, the key is
// readable by others or does not match the certificate, or a CA is given
// without a certificate.
absl::StatusOr<std::shared_ptr<const ServerTlsContext>> MakeServerTls(
    const ServerTls& tls, TlsProtocol protocol = TlsProtocol::kHttp2);

// The name that identifies a verified client certificate, as gRPC picks it
// (grpc::AuthContext::GetPeerIdentity): its first subject alternative name
// (DNS, URI, e-mail or IP address), else its subject's common name; with
// the kind in front ("dns:", "uri:", "email:", "ip:", "cn:"), so that a
// common name and a SAN of the same text name different peers; "" when it
// has neither. Whole: `CertificatePrincipal` (auth.h) makes a principal of
// it. `cert` is an OpenSSL X509.
std::string CertificateIdentity(const x509_st* cert);

// How a client reaches a server.
struct ChannelSecurity {
  std::string ca_file;    // non-empty: TLS, the server's cert must chain to this CA
  std::string cert_file;  // with key_file: a client certificate (mutual TLS)
  std::string key_file;
  std::string server_name;  // the name the server's cert must carry (default: the target's host)
  std::string token_file;   // non-empty: `authorization: Bearer` of its first token on every call
  bool tls() const { return !ca_file.empty(); }
};

// A channel to `target` with `security`; `args` are the caller's other
// channel arguments.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           grpc::ChannelArguments args);

}  // namespace deltaserve
