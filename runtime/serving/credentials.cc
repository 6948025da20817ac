#include "runtime/serving/credentials.h"

#include <grpcpp/support/client_interceptor.h>

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

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("give both --tls-cert and --tls-key, or neither");
  }
  if (tls.cert_file.empty()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "a client CA (mutual TLS) needs the server's own --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadPem(tls.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadSecretFile(tls.key_file, "--tls-key", kMaxPemBytes);
  if (!key.ok()) return key.status();
  pair.cert_chain = std::move(*cert);
  pair.private_key = std::move(*key);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadPem(tls.client_ca_file, "client CA");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = std::move(*ca);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
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
