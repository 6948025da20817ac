// TLS and bearer tokens on gRPC's two ends: the credentials a listener of the
// coordinator serves with, and the channel a client, `deltaserve batch`,
// bench-serve or a worker opens to it (TLS if asked, and the token on every
// call). docs/security.md says which flag sets which field.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace deltaserve {

// A listener's TLS: PEM files; all empty is plaintext.
struct ServerTls {
  std::string cert_file;       // the certificate chain the server presents
  std::string key_file;        // its private key (mode 600)
  std::string client_ca_file;  // non-empty: mutual TLS, peers need a cert this CA signed
};

// Plaintext when `tls` names no files; refused, naming the file, when a file
// cannot be read, the key is readable by others, or a CA is given without a
// certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls);

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
