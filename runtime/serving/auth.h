// Who may use the serving ports. Bearer tokens are read from files (one
// `principal:token` a line), compared in constant time, and name the
// principal a call runs as; with mutual TLS the client certificate names it
// instead. docs/security.md is the operator's side of this.
//
// The rule, per listener: a listener with tokens refuses a call without the
// `authorization: Bearer TOKEN` metadata of one of them (UNAUTHENTICATED); a
// listener with mutual TLS refuses a connection without a certificate its CA
// signed (in the TLS handshake, before any call, which the HTTP/2 guard in
// front of the port does: h2_guard.h). The check runs at the start
// of every handler of the Generation and WorkerLink services;
// grpc.health.v1.Health and server reflection answer without it (they tell a
// load balancer whether to send traffic, and the public API's schema).
#pragma once

#include <grpcpp/server_context.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltaserve {

// Tokens and principals are bounded, and of fixed alphabets so that a token
// file cannot be misread and a principal is safe in a log line: a token is
// RFC 6750's b64token (letters, digits, `-._~+/`, then `=` padding), 16 to
// 256 bytes; a principal is 1 to 64 of letters, digits and `-._@`.
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 256;
inline constexpr size_t kMaxPrincipalBytes = 64;
inline constexpr int64_t kMaxTokenFileBytes = 1 << 20;

struct TokenEntry {
  std::string principal;
  std::string token;
};

// A token file: lines `principal:token` or a bare `token` (principal
// `line-N`), blank lines and `# comments` ignored. Refused, naming the file
// and line, when it is not a regular file of at most kMaxTokenFileBytes, is
// readable or writable by group or others (chmod 600), holds no token, a
// malformed line, or a token or principal twice.
absl::StatusOr<std::vector<TokenEntry>> ReadTokenFile(const std::string& path);

// The token a client or worker sends: that of the file's first entry (so one
// `principal:token` file serves both the server and its client).
absl::StatusOr<std::string> ReadBearerToken(const std::string& path);

// A file that may hold a secret (a TLS private key): regular, at most
// `max_bytes`, not readable by group or others. `what` names it in errors.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what,
                                           int64_t max_bytes);

// Tokens to look presented ones up in. Find compares against every entry,
// each padded to kMaxTokenBytes, with no early exit, so its time does not
// depend on the presented token or on how much of it matches.
class TokenSet {
 public:
  explicit TokenSet(std::vector<TokenEntry> entries);
  // The principal whose token is `presented`, if any.
  std::optional<std::string> Find(absl::string_view presented) const;
  size_t size() const { return entries_.size(); }

 private:
  std::vector<TokenEntry> entries_;
};

// The check at the start of each handler on one listener.
class Authenticator {
 public:
  // `tokens`: required bearer tokens (none: no token check). `client_certs`:
  // the listener does mutual TLS, so a verified certificate names the peer.
  Authenticator(std::optional<TokenSet> tokens, bool client_certs);

  // The principal the call runs as: the token's, else the certificate's
  // (CertificatePrincipal), else "" when this listener authenticates no
  // one. UNAUTHENTICATED, saying what is missing,
  // when tokens are required and the call has none that matches.
  // Each call that passes is also reported to the hook, if set.
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContext& context) const;
  // The same for a call that is not gRPC's (the HTTP API): its
  // `Authorization` header, if it has one, and the identity of its
  // connection's verified client certificate (CertificateIdentity), if any.
  // The hook is not called.
  absl::StatusOr<std::string> Authenticate(
      std::optional<absl::string_view> authorization,
      const std::optional<std::string>& certificate_identity) const;
  // Called with the call's peer (grpc::ServerContext::peer) for each call
  // that passes, from gRPC's threads: the HTTP/2 guard keeps the slots of
  // connections that authenticated. Set before the listener serves.
  void SetOnAuthenticated(std::function<void(const std::string& peer)> hook) {
    on_authenticated_ = std::move(hook);
  }
  // Under mutual TLS: the identity of the verified client certificate of
  // the connection a call's peer (grpc::ServerContext::peer) names, or
  // nullopt if it has none. The HTTP/2 guard terminates TLS (h2_guard.h),
  // so gRPC's own AuthContext knows no certificate. Set before the listener
  // serves; without it, a listener with client certificates refuses every
  // call.
  void SetPeerIdentity(std::function<std::optional<std::string>(const std::string& peer)> lookup) {
    peer_identity_ = std::move(lookup);
  }

  // Whether callers are told apart (tokens or certificates).
  bool enabled() const { return tokens_.has_value() || client_certs_; }

 private:
  absl::StatusOr<std::string> Check(
      std::optional<absl::string_view> authorization,
      const std::function<std::optional<std::string>()>& certificate_identity) const;

  std::optional<TokenSet> tokens_;
  bool client_certs_;
  std::function<void(const std::string& peer)> on_authenticated_;
  std::function<std::optional<std::string>(const std::string& peer)> peer_identity_;
};

// The principal a verified client certificate's identity
// (CertificateIdentity, with its kind) runs as: "x509:" and the identity,
// every byte other than letters, digits and `-.@:` written `_xx` (its lower-case hex),
// so that distinct identities never share a principal and none holds '/'.
// An identity that would make it longer than kMaxCertificatePrincipalBytes
// keeps its start, then `#` and 32 hex digits of its SHA-256.
inline constexpr size_t kMaxCertificatePrincipalBytes = 128;
std::string CertificatePrincipal(absl::string_view identity);

// The request id the coordinator knows a client's request by: the id within
// its principal's namespace, so that one principal can neither abort nor
// collide with another's requests, whatever ids they choose. "" (no
// authentication) leaves the id as it is.
std::string ScopedRequestId(const std::string& principal, const std::string& request_id);

// The inverse, for listing requests: the id `principal` knows `scoped_id`
// by, or nullopt when the request is another principal's. "" (no
// authentication) has one namespace: every id is its own.
std::optional<std::string> OwnRequestId(const std::string& principal, const std::string& scoped_id);

// Whether `host` (an IPv4 or IPv6 literal, or "localhost") is a loopback
// address, reachable from this machine only.
bool IsLoopbackHost(const std::string& host);

}  // namespace deltaserve
