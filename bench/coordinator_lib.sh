# Sourced by the benchmarks that put MPI worker jobs behind one
# `deltaserve coordinator` (bench/coordinator_pipeline_bench.sh,
# bench/pipeline_decode_bench.sh, bench/million_prefill.sh):
#   start_coordinator MODEL RUN_DIR [coordinator flags...]
#     starts it on free ports; sets $coordinator (pid), $address (clients) and
#     $worker_address; its log is RUN_DIR/coordinator.log.
#   start_worker RANKS MODEL LOG [worker flags...]
#     an MPI job of RANKS pipeline stages, one rank and one thread each,
#     pinned to cores; sets $worker (mpirun's pid) once it is attached.
#   stop_worker
#     SIGTERM to the job (its ranks print --stats, if given, as they exit);
#     returns once the coordinator has no worker.
start_coordinator() {
  local model=$1 run=$2
  shift 2
  build/bin/deltaserve coordinator --model "$model" --host 127.0.0.1 --port 0 --worker-port 0 \
    --port-file "$run/port" "$@" 2>"$run/coordinator.log" &
  coordinator=$!
  for _ in $(seq 600); do [[ -s $run/port ]] && break; sleep 0.1; done
  [[ -s $run/port ]] || { cat "$run/coordinator.log" >&2; return 1; }
  address=127.0.0.1:$(sed -n 1p "$run/port")
  worker_address=127.0.0.1:$(sed -n 3p "$run/port")
}

start_worker() {
  local ranks=$1 model=$2 log=$3
  shift 3
  OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to core \
    --mca mpi_yield_when_idle 1 -np "$ranks" build/bin/deltaserve worker \
    --coordinator "$worker_address" --model "$model" --pp "$ranks" --threads 1 "$@" 2>"$log" &
  worker=$!
  for _ in $(seq 600); do
    build/bin/deltaserve client status --server "$address" 2>/dev/null | grep -q worker_attached &&
      return 0
    sleep 0.1
  done
  cat "$log" >&2
  return 1
}

stop_worker() {
  kill -TERM "$worker"
  wait "$worker" 2>/dev/null || true
  worker=
  for _ in $(seq 100); do
    build/bin/deltaserve client status --server "$address" 2>/dev/null |
      grep -q worker_attached || break
    sleep 0.1
  done
}
