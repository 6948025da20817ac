// The flags of every command that opens a channel to a server (client,
// batch --server, bench-serve, worker): TLS files and the bearer token file,
// read into runtime/serving/credentials.h's ChannelSecurity.
#pragma once

#include <string>
#include <vector>

#include "launcher/flags.h"
#include "runtime/serving/credentials.h"

namespace deltaserve {

// --tls-ca, --tls-cert, --tls-key, --tls-server-name and `token_flag` (the
// token file's flag: --token-file for clients, --worker-token-file for
// workers).
std::vector<FlagSpec> ChannelSecurityFlags(const std::string& token_flag);
ChannelSecurity ChannelSecurityFrom(const Flags& flags, const std::string& token_flag);

}  // namespace deltaserve
