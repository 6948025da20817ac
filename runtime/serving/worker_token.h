// The worker token a coordinator makes for itself when it is given no worker
// credentials (no --worker-token-file, no --tls-worker-ca): without one, any
// local process, of any user, could attach as a worker and read every
// prompt. The token is written, mode 600, to a file of the coordinator's
// user that `deltaserve worker` of the same user on the same host reads by
// itself: DefaultWorkerTokenPath of the worker port. docs/security.md says
// where, and how workers elsewhere get it.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace deltaserve {

// 256 random bits from the kernel, in hex: a bearer token auth.h accepts.
absl::StatusOr<std::string> NewWorkerToken();

// Where a coordinator whose worker port is `port` writes the token it made,
// and where a worker attaching to that port looks for it:
// $XDG_RUNTIME_DIR/deltaserve/worker-token-PORT when XDG_RUNTIME_DIR names a
// directory (a per-user directory on systemd hosts), else
// $HOME/.deltaserve/worker-token-PORT; "" when neither is set.
std::string DefaultWorkerTokenPath(int port);

// The port of a gRPC target (`host:port`, `[::1]:port`, `dns:///host:port`,
// `ipv4:addr:port`), if it names one.
std::optional<int> TargetPort(const std::string& target);

// Writes `token` as the file's one line, mode 600 whatever the umask,
// atomically (a worker never reads half a token), never through a symbolic
// link, and only into a directory of this user's that no group or other may
// write (refused, naming the directory, its owner or mode). `make_dir`:
// create the file's directory (mode 700) when it is missing.
absl::Status WriteWorkerTokenFile(const std::string& path, const std::string& token, bool make_dir);

// Removes `path` if it still holds `token` (a later coordinator on the same
// port may have replaced it).
void RemoveWorkerTokenFile(const std::string& path, const std::string& token);

}  // namespace deltaserve
