// A TCP listening socket, for the servers of this folder that accept their
// connections themselves: the metrics endpoint (http_server.h), the OpenAI
// HTTP API (http_api.h) and the HTTP/2 guard in front of gRPC's ports
// (h2_guard.h).
#pragma once

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltaserve {

struct ListeningSocket {
  int fd = -1;    // non-blocking, close-on-exec; the caller closes it
  int port = -1;  // the one asked for, or the one the system picked for 0
};

// Listens on host:port (port 0: a free port). host is a name or address
// ("127.0.0.1", "::", "localhost"); empty means all interfaces; the first
// address it resolves to that takes a socket wins. Errors start with `who`
// and name host:port and the system's reason (e.g. the port is in use:
// UNAVAILABLE).
absl::StatusOr<ListeningSocket> ListenTcp(const std::string& host, int port, absl::string_view who);

// "host:port", with brackets around an IPv6 host and "*" for an empty one.
std::string HostPort(const std::string& host, int port);

// The peer at `addr` for the log ("host:port"), and in *source whom it
// counts as for the per-address caps on connections of the servers that
// accept their own: its IPv4 address, or its IPv6 /64 (one host's usual
// share, so that its addresses do not count apart; an IPv4-mapped one
// whole).
std::string PeerName(const sockaddr_storage& addr, std::string* source);

// errno `err` as a Status with `what` in front: EACCES/EPERM are
// PERMISSION_DENIED, EADDRINUSE UNAVAILABLE, EADDRNOTAVAIL/EINVAL
// INVALID_ARGUMENT, the rest INTERNAL.
absl::Status ErrnoStatus(int err, absl::string_view what);

}  // namespace deltaserve
