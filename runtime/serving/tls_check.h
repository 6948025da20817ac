// Checks of a server's TLS certificate and key made before the listeners
// start, so that a mistake is named as what it is: gRPC only reports that it
// could not listen.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "runtime/serving/credentials.h"

namespace deltaserve {

// With `tls.cert_file` given: a warning on stderr, naming the dates, when the
// certificate has expired or is not valid yet (clients will refuse it).
// Files that cannot be read or parsed, and a key that is not the
// certificate's, are MakeServerTls's errors, which name them.
absl::Status CheckServerCertificate(const ServerTls& tls);

// Refused, naming both files and the CA, when the client CA file and the
// worker CA file share a CA: a certificate in both (however each file
// encodes it) or two with the same public key (a CA reissued with its key),
// under which one client certificate would verify on both ports. Parsed,
// not compared as bytes: a bundle that holds the other file's CA among
// others is caught too. Errors name a file that cannot be read or holds no
// certificate.
absl::Status CheckCaFilesShareNoCa(const std::string& client_ca_file,
                                   const std::string& worker_ca_file);

// Whether the server at gRPC target `target` (host:port) answers a TLS
// ClientHello as a TLS server does (a handshake or alert record), within
// `timeout`: for a plaintext client whose connection keeps failing, to say
// why instead of waiting out its connect timeout.
bool SpeaksTls(const std::string& target, std::chrono::milliseconds timeout);

}  // namespace deltaserve
