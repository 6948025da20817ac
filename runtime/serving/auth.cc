#include "runtime/serving/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace deltaserve {
namespace {

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
         c == '~' || c == '+' || c == '/';
}

bool IsPrincipalChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
         c == '@';
}

// RFC 6750's b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
bool IsToken(absl::string_view t) {
  size_t i = 0;
  while (i < t.size() && IsTokenChar(t[i])) ++i;
  if (i == 0) return false;
  while (i < t.size() && t[i] == '=') ++i;
  return i == t.size();
}

absl::Status CheckToken(absl::string_view token, const std::string& where) {
  if (!IsToken(token)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a token is letters, digits and -._~+/ (then = padding)"));
  }
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a token of ", token.size(),
                                                   " bytes; it must have ", kMinTokenBytes, " to ",
                                                   kMaxTokenBytes, " (e.g. openssl rand -hex 32)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what,
                                           int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": mode ", mode,
                                                    " lets group or others read or write it; it "
                                                    "holds a secret: chmod 600 ",
                                                    path));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, ": ", st.st_size, " bytes, over the limit of ", max_bytes));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;  // shrank while read: take what is there
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

absl::StatusOr<std::vector<TokenEntry>> ReadTokenFile(const std::string& path) {
  auto text = ReadSecretFile(path, "token file", kMaxTokenFileBytes);
  if (!text.ok()) return text.status();
  std::vector<TokenEntry> entries;
  std::set<std::string> principals, tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat("token file ", path, " line ", line_number);
    TokenEntry entry;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) {
      entry.principal = absl::StrCat("line-", line_number);
      entry.token = std::string(line);
    } else {
      entry.principal = std::string(line.substr(0, colon));
      entry.token = std::string(line.substr(colon + 1));
      if (entry.principal.empty() || entry.principal.size() > kMaxPrincipalBytes ||
          !std::all_of(entry.principal.begin(), entry.principal.end(), IsPrincipalChar)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a principal is 1 to ", kMaxPrincipalBytes,
                         " letters, digits and -._@ (the line is principal:token)"));
      }
    }
    if (absl::Status ok = CheckToken(entry.token, where); !ok.ok()) return ok;
    if (!principals.insert(entry.principal).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": principal '", entry.principal, "' is listed twice"));
    }
    if (!tokens.insert(entry.token).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the same token is listed twice"));
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": holds no token"));
  }
  return entries;
}

absl::StatusOr<std::string> ReadBearerToken(const std::string& path) {
  auto entries = ReadTokenFile(path);
  if (!entries.ok()) return entries.status();
  return entries->front().token;
}

TokenSet::TokenSet(std::vector<TokenEntry> entries) : entries_(std::move(entries)) {}

std::optional<std::string> TokenSet::Find(absl::string_view presented) const {
  // Over-long tokens are refused before the loop: their length is no secret.
  if (presented.size() > kMaxTokenBytes) return std::nullopt;
  unsigned char given[kMaxTokenBytes] = {};
  std::memcpy(given, presented.data(), presented.size());
  size_t found = entries_.size();
  for (size_t e = 0; e < entries_.size(); ++e) {
    unsigned char stored[kMaxTokenBytes] = {};
    const std::string& token = entries_[e].token;
    std::memcpy(stored, token.data(), token.size());
    // Volatile: the compiler may not turn this into an early-exit memcmp.
    volatile unsigned char diff = static_cast<unsigned char>(token.size() != presented.size());
    for (size_t i = 0; i < kMaxTokenBytes; ++i) diff = diff | (given[i] ^ stored[i]);
    // Branch-free select: a mask of all ones when this entry matched.
    const size_t match = static_cast<size_t>(0) - static_cast<size_t>(diff == 0);
    found = (found & ~match) | (e & match);
  }
  if (found == entries_.size()) return std::nullopt;
  return entries_[found].principal;
}

Authenticator::Authenticator(std::optional<TokenSet> tokens, bool client_certs)
    : tokens_(std::move(tokens)), client_certs_(client_certs) {}

absl::StatusOr<std::string> Authenticator::Authenticate(const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  std::optional<absl::string_view> authorization;
  if (it != metadata.end()) authorization = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<std::string> principal = Check(authorization, [&]() -> std::optional<std::string> {
    if (!peer_identity_) return std::nullopt;
    return peer_identity_(context.peer());
  });
  if (principal.ok() && on_authenticated_) on_authenticated_(context.peer());
  return principal;
}

absl::StatusOr<std::string> Authenticator::Authenticate(
    std::optional<absl::string_view> authorization,
    const std::optional<std::string>& certificate_identity) const {
  return Check(authorization, [&] { return certificate_identity; });
}

absl::StatusOr<std::string> Authenticator::Check(
    std::optional<absl::string_view> authorization,
    const std::function<std::optional<std::string>()>& certificate_identity) const {
  if (tokens_.has_value()) {
    if (!authorization.has_value()) {
      return absl::UnauthenticatedError(
          "this server requires a bearer token: send `authorization: Bearer TOKEN` "
          "(deltaserve client --token-file F; an OpenAI client's API key)");
    }
    absl::string_view token = *authorization;
    if (!absl::ConsumePrefix(&token, "Bearer ")) {
      return absl::UnauthenticatedError("the authorization is not `Bearer TOKEN`");
    }
    std::optional<std::string> principal = tokens_->Find(token);
    if (!principal.has_value()) {
      return absl::UnauthenticatedError("the bearer token is not one this server accepts");
    }
    return *principal;
  }
  if (client_certs_) {
    // The TLS handshake, in the guard, verified the certificate; its identity
    // names the peer. A connection the guard no longer knows (it closed
    // meanwhile) has none, and its call is refused rather than run as no one.
    std::optional<std::string> identity = certificate_identity();
    if (!identity.has_value()) {
      return absl::UnauthenticatedError(
          "this server requires a client certificate, and the call's connection has no "
          "verified one");
    }
    return CertificatePrincipal(*identity);
  }
  return std::string();
}

std::string CertificatePrincipal(absl::string_view identity) {
  // Escaped reversibly, so that it is safe in a log line and holds no '/'
  // (ScopedRequestId's separator); '_' is the escape, and '#' (which no
  // escaped identity holds) marks a hashed one.
  std::string escaped;
  for (const char c : identity) {
    const auto byte = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(byte) || c == '-' || c == '.' || c == '@' || c == ':') {
      escaped += c;
    } else {
      absl::StrAppend(&escaped, "_", absl::Hex(byte, absl::kZeroPad2));
    }
  }
  constexpr absl::string_view kPrefix = "x509:";
  if (kPrefix.size() + escaped.size() <= kMaxCertificatePrincipalBytes) {
    return absl::StrCat(kPrefix, escaped);
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(identity.data()), identity.size(), digest);
  const std::string hash =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), 16));
  size_t keep = kMaxCertificatePrincipalBytes - kPrefix.size() - 1 - hash.size();
  // Not into the middle of an escape.
  if (const size_t escape = escaped.rfind('_', keep - 1);
      escape != std::string::npos && escape + 3 > keep) {
    keep = escape;
  }
  return absl::StrCat(kPrefix, escaped.substr(0, keep), "#", hash);
}

std::string ScopedRequestId(const std::string& principal, const std::string& request_id) {
  if (principal.empty()) return request_id;
  return absl::StrCat(principal, "/", request_id);
}

std::optional<std::string> OwnRequestId(const std::string& principal,
                                        const std::string& scoped_id) {
  if (principal.empty()) return scoped_id;
  // Principals hold no '/', so the prefix names exactly one of them.
  const std::string prefix = absl::StrCat(principal, "/");
  if (scoped_id.size() <= prefix.size() || scoped_id.compare(0, prefix.size(), prefix) != 0) {
    return std::nullopt;
  }
  return scoped_id.substr(prefix.size());
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  std::string literal = host;
  if (literal.size() >= 2 && literal.front() == '[' && literal.back() == ']') {
    literal = literal.substr(1, literal.size() - 2);
  }
  in_addr v4;
  if (inet_pton(AF_INET, literal.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, literal.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace deltaserve
