# Sourced by scripts that need a running `deltaserve serve`:
#   start_serve MODEL_DIR RUN_DIR [serve flags...]
# starts it on a free port, waits until it listens, and sets $server (its pid)
# and $address (127.0.0.1:PORT), and $http_address (127.0.0.1:PORT of the
# HTTP API, when the flags ask for one). The caller stops it (kill -TERM $server).
start_serve() {
  local model=$1 run=$2
  shift 2
  build/bin/deltaserve serve --model "$model" --port 0 --port-file "$run/port" "$@" \
    2>"$run/server.log" &
  server=$!
  for _ in $(seq 600); do
    [[ -s $run/port ]] && break
    kill -0 "$server" 2>/dev/null || { cat "$run/server.log" >&2; return 1; }
    sleep 0.1
  done
  [[ -s $run/port ]] || { echo "deltaserve serve did not start" >&2; return 1; }
  address=127.0.0.1:$(head -1 "$run/port")
  http_address=127.0.0.1:$(sed -n 4p "$run/port")
}
