#!/usr/bin/env bash
# Open MPI's launch agent for test hosts (tests/multihost/test_hosts.h): what
# mpirun runs in place of ssh (`--mca plm_rsh_agent`) to start its daemon on
# a host. It is called as ssh is, `[options] HOST COMMAND...`, and runs
# COMMAND in that host's network namespace and in a UTS namespace of its own
# whose hostname is the host's, so that Open MPI sees another node (and uses
# no shared memory across it). DELTASERVE_TEST_HOSTS names the file of the
# hosts, a line each: `ADDRESS NAMESPACE HOSTNAME`.
set -euo pipefail
while [[ "${1:-}" == -* ]]; do shift; done
host=${1:?usage: netns_agent.sh HOST COMMAND...}
shift
line=$(grep -m1 "^${host} " "${DELTASERVE_TEST_HOSTS:?}") || {
  echo "netns_agent.sh: ${host} is not a test host (${DELTASERVE_TEST_HOSTS})" >&2
  exit 255
}
read -r _ namespace hostname <<<"$line"
# The command comes as ssh passes it, words to be read by a shell.
exec ip netns exec "$namespace" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' \
  "$hostname" "$*"
