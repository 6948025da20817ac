#include "runtime/serving/listen_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltaserve {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::system_category().message(err));
  switch (err) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EADDRINUSE:
      return absl::UnavailableError(message);
    case EADDRNOTAVAIL:
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string HostPort(const std::string& host, int port) {
  if (host.empty()) return absl::StrCat("*:", port);
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<ListeningSocket> ListenTcp(const std::string& host, int port,
                                          absl::string_view who) {
  const std::string where = HostPort(host, port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(who, " on ", where, ": bad port"));
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(port);
  const int gai =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &addresses);
  if (gai != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": cannot resolve ", where, ": ", ::gai_strerror(gai)));
  }
  int listen_fd = -1;
  int last_errno = 0;
  const char* failed_step = "socket";
  for (const addrinfo* ai = addresses; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      failed_step = "socket";
      continue;
    }
    // A restarted server can rebind while old connections sit in TIME_WAIT.
    const int one = 1;
    if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
      last_errno = errno;
      failed_step = "setsockopt(SO_REUSEADDR)";
    } else if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last_errno = errno;
      failed_step = "bind";
    } else if (::listen(fd, SOMAXCONN) != 0) {
      last_errno = errno;
      failed_step = "listen";
    } else {
      listen_fd = fd;
      break;
    }
    ::close(fd);
  }
  ::freeaddrinfo(addresses);
  if (listen_fd < 0) {
    return ErrnoStatus(last_errno,
                       absl::StrCat(who, ": cannot listen on ", where, " (", failed_step, ")"));
  }
  sockaddr_storage bound = {};
  socklen_t bound_len = sizeof(bound);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    const int err = errno;
    ::close(listen_fd);
    return ErrnoStatus(err, absl::StrCat(who, " on ", where, ": getsockname"));
  }
  ListeningSocket socket{listen_fd, port};
  if (bound.ss_family == AF_INET) {
    socket.port = ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  } else if (bound.ss_family == AF_INET6) {
    socket.port = ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
  }
  return socket;
}

std::string PeerName(const sockaddr_storage& addr, std::string* source) {
  char text[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    *source = text;
    return HostPort(text, ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    in6_addr prefix = in6->sin6_addr;
    if (!IN6_IS_ADDR_V4MAPPED(&prefix)) std::memset(prefix.s6_addr + 8, 0, 8);
    char prefix_text[INET6_ADDRSTRLEN] = "";
    inet_ntop(AF_INET6, &prefix, prefix_text, sizeof(prefix_text));
    *source = IN6_IS_ADDR_V4MAPPED(&prefix) ? prefix_text : absl::StrCat(prefix_text, "/64");
    return HostPort(text, ntohs(in6->sin6_port));
  }
  *source = "";
  return "an unknown peer";
}

}  // namespace deltaserve
