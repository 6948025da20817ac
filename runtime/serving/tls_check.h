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

// Whether the server at gRPC target `target` (host:port) answers a TLS
// ClientHello as a TLS server does (a handshake or alert record), within
// `timeout`: for a plaintext client whose connection keeps failing, to say
// why instead of waiting out its connect timeout.
bool SpeaksTls(const std::string& target, std::chrono::milliseconds timeout);

}  // namespace deltaserve
