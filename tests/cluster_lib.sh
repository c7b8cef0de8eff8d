# Shared by the cluster tests (sourced; needs $flowrun, $out, $out/secret and a pids array for cleanup).
# daemons LOG_PREFIX [flowrun node args...]: node daemons w1 and w2 (stdout/stderr in $out/PREFIXw1.out ...), their
# ports in $out/w1.port and $out/w2.port; w2_pid is w2's
daemons() {
  local log=$1; shift
  rm -f "$out/w1.port" "$out/w2.port"
  for w in w1 w2; do
    "$flowrun" node --listen 127.0.0.1:0 --secret-file "$out/secret" --port-file "$out/$w.port" --threads 2 "$@" \
      > "$out/$log$w.out" 2> "$out/$log$w.err" &
    pids+=($!)
  done
  w2_pid=${pids[-1]}
  for w in w1 w2; do
    for _ in $(seq 1 200); do [[ -s "$out/$w.port" ]] && break; sleep 0.05; done
    [[ -s "$out/$w.port" ]] || { echo "node $w did not start:"; cat "$out/$log$w.err"; exit 1; }
  done
}
# cluster_file FILE [[cluster] lines...]: w1 and w2 at their ports, heartbeats every 250 ms
cluster_file() {
  local f=$1; shift
  { echo "[cluster]"; echo "heartbeat_ms = 250"; for line in "$@"; do echo "$line"; done
    for w in w1 w2; do echo "[cluster.nodes.$w]"; echo "address = \"127.0.0.1:$(cat "$out/$w.port")\""; done; } > "$f"
}
