#include "runtime/serving/credentials.h"

#include <arpa/inet.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/serving/auth.h"

namespace deltaserve {
namespace {

// Certificates and keys are small; a bound keeps a wrong path (a log, a
// device) from being read whole.
constexpr int64_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) {
    text.append(buffer, n);
    if (static_cast<int64_t>(text.size()) > kMaxPemBytes) {
      std::fclose(f);
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", path, ": over the limit of ", kMaxPemBytes, " bytes"));
    }
  }
  std::fclose(f);
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a PEM file"));
  }
  return text;
}

// Adds `authorization: Bearer TOKEN` to every call of the channel, on
// plaintext loopback channels too (gRPC's call credentials refuse those).
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *value_);
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;
};

class BearerInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&value_);
  }

 private:
  const std::string value_;
};

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;

// `what`, and OpenSSL's reason for the last error if it gave one.
std::string OpenSslError(const std::string& what) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return what;
  char reason[256];
  ERR_error_string_n(code, reason, sizeof(reason));
  return absl::StrCat(what, " (", reason, ")");
}

// ALPN: the listener's protocol or nothing. A client that offers other
// protocols only gets no_application_protocol, not a connection that fails on
// its first bytes; one that offers none gets the listener's.
int SelectProtocol(SSL*, const unsigned char** out, unsigned char* out_length,
                   const unsigned char* in, unsigned int in_length, void* arg) {
  const auto* wanted = static_cast<const std::string*>(arg);
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(
          &selected, out_length, reinterpret_cast<const unsigned char*>(wanted->data()),
          static_cast<unsigned int>(wanted->size()), in, in_length) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

ServerTlsContext::~ServerTlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::shared_ptr<const ServerTlsContext>> MakeServerTls(const ServerTls& tls,
                                                                      TlsProtocol protocol) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("give both --tls-cert and --tls-key, or neither");
  }
  if (tls.cert_file.empty()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "a client CA (mutual TLS) needs the server's own --tls-cert and --tls-key");
    }
    return std::shared_ptr<const ServerTlsContext>();
  }
  auto cert = ReadPem(tls.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadSecretFile(tls.key_file, "--tls-key", kMaxPemBytes);
  if (!key.ok()) return key.status();
  std::string client_ca;
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadPem(tls.client_ca_file, "client CA");
    if (!ca.ok()) return ca.status();
    client_ca = std::move(*ca);
  }
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(TLS_server_method());
  if (raw == nullptr) return absl::InternalError(OpenSslError("cannot make a TLS context"));
  // Owned from here on, also on the error paths.
  std::shared_ptr<ServerTlsContext> context(new ServerTlsContext(raw, !tls.client_ca_file.empty()));
  // ALPN's wire form: each name after its length.
  context->alpn_ =
      protocol == TlsProtocol::kHttp2 ? std::string("\x02h2", 3) : std::string("\x08http/1.1", 9);
  SSL_CTX* ctx = raw;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // gRPC's own server ciphers for TLS 1.2 (TLS 1.3 keeps OpenSSL's).
  SSL_CTX_set_cipher_list(ctx,
                          "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
                          "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:"
                          "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305");
  // No renegotiation, and no resumption: no session cache or tickets, so
  // that handshakes leave nothing behind in the server, and TLS 1.3 sends
  // no tickets after the handshake. A client that closes without
  // close_notify has ended its stream (HTTP/2 frames say where requests end).
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET |
                               SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_IGNORE_UNEXPECTED_EOF |
                               SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(ctx, 0);
  // The guard writes from a buffer that may move and gives as much as it
  // has; idle connections give their record buffers back.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_alpn_select_cb(ctx, SelectProtocol, &context->alpn_);

  {
    BioPtr bio(BIO_new_mem_buf(cert->data(), static_cast<int>(cert->size())));
    X509Ptr leaf(bio ? PEM_read_bio_X509_AUX(bio.get(), nullptr, nullptr, nullptr) : nullptr);
    if (leaf == nullptr || SSL_CTX_use_certificate(ctx, leaf.get()) != 1) {
      return absl::InvalidArgumentError(
          OpenSslError(absl::StrCat("--tls-cert ", tls.cert_file, ": no certificate in it")));
    }
    // The rest of the file is the chain presented with it.
    while (X509* next = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      if (SSL_CTX_add0_chain_cert(ctx, next) != 1) {
        X509_free(next);
        return absl::InvalidArgumentError(
            OpenSslError(absl::StrCat("--tls-cert ", tls.cert_file, ": a bad chain certificate")));
      }
    }
    ERR_clear_error();  // the end of the file
  }
  bool key_used = false;
  {
    BioPtr bio(BIO_new_mem_buf(key->data(), static_cast<int>(key->size())));
    EVP_PKEY* pkey = bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr;
    if (pkey == nullptr) {
      return absl::InvalidArgumentError(OpenSslError(
          absl::StrCat("--tls-key ", tls.key_file, ": no private key in it (PEM, unencrypted)")));
    }
    // OpenSSL refuses a key that is not the certificate's already here.
    key_used = SSL_CTX_use_PrivateKey(ctx, pkey) == 1;
    EVP_PKEY_free(pkey);
    ERR_clear_error();
  }
  if (!key_used || SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", tls.key_file,
                     " is not the key of the certificate in --tls-cert ", tls.cert_file));
  }
  if (!client_ca.empty()) {
    BioPtr bio(BIO_new_mem_buf(client_ca.data(), static_cast<int>(client_ca.size())));
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    int count = 0;
    while (X509* ca = bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr) {
      X509_STORE_add_cert(store, ca);
      if (X509_NAME* name = X509_NAME_dup(X509_get_subject_name(ca)); name != nullptr) {
        sk_X509_NAME_push(names, name);
      }
      X509_free(ca);
      ++count;
    }
    ERR_clear_error();
    // The CertificateRequest names the CAs, so that a client with several
    // certificates picks the right one.
    SSL_CTX_set_client_CA_list(ctx, names);
    if (count == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("client CA ", tls.client_ca_file, ": no certificate in it"));
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  static const unsigned char kContextId[] = "deltaserve";
  SSL_CTX_set_session_id_context(ctx, kContextId, sizeof(kContextId) - 1);
  return context;
}

std::string CertificateIdentity(const x509_st* cert) {
  if (cert == nullptr) return "";
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  std::string identity;
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names) && identity.empty(); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type == GEN_DNS || name->type == GEN_URI || name->type == GEN_EMAIL) {
      const ASN1_IA5STRING* text = name->d.ia5;
      if (ASN1_STRING_length(text) <= 0) continue;
      identity = name->type == GEN_DNS ? "dns:" : name->type == GEN_URI ? "uri:" : "email:";
      identity.append(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)),
                      static_cast<size_t>(ASN1_STRING_length(text)));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      const int length = ASN1_STRING_length(ip);
      char text[INET6_ADDRSTRLEN] = "";
      if ((length == 4 || length == 16) &&
          inet_ntop(length == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(ip), text,
                    sizeof(text)) != nullptr) {
        identity = absl::StrCat("ip:", text);
      }
    }
  }
  GENERAL_NAMES_free(names);
  if (!identity.empty()) return identity;
  X509_NAME* subject = X509_get_subject_name(cert);
  const int at = subject == nullptr ? -1 : X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at < 0) return "";
  const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
  unsigned char* utf8 = nullptr;
  const int length = ASN1_STRING_to_UTF8(&utf8, cn);
  if (length > 0) {
    identity = "cn:";
    identity.append(reinterpret_cast<const char*>(utf8), static_cast<size_t>(length));
  }
  OPENSSL_free(utf8);
  return identity;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError("give both --tls-cert and --tls-key, or neither");
  }
  if (security.tls()) {
    grpc::SslCredentialsOptions options;
    auto ca = ReadPem(security.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = std::move(*ca);
    if (!security.cert_file.empty()) {
      auto cert = ReadPem(security.cert_file, "--tls-cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadSecretFile(security.key_file, "--tls-key", kMaxPemBytes);
      if (!key.ok()) return key.status();
      options.pem_cert_chain = std::move(*cert);
      options.pem_private_key = std::move(*key);
    }
    if (!security.server_name.empty()) {
      args.SetSslTargetNameOverride(security.server_name);
    }
    credentials = grpc::SslCredentials(options);
  } else {
    if (!security.cert_file.empty() || !security.server_name.empty()) {
      return absl::InvalidArgumentError(
          "a client certificate or server name is for TLS: give --tls-ca (the server's CA) too");
    }
    credentials = grpc::InsecureChannelCredentials();
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token_file.empty()) {
    auto token = ReadBearerToken(security.token_file);
    if (!token.ok()) return token.status();
    interceptors.push_back(std::make_unique<BearerInterceptorFactory>(std::move(*token)));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace deltaserve
