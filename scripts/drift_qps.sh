#!/usr/bin/env bash
# QPS of one server process with drift tracking on (--drift_window 10000) and off (--drift_window 0), measured
# in alternating rounds in the same run so that machine noise hits both alike (docs/daily-loop.md).
#   scripts/drift_qps.sh MODEL_BASE_PATH [ROUNDS] [SECONDS]
# Needs wrk (`make sysdeps`). Prints one line per round and the median QPS of each setting.
set -euo pipefail

BASE="${1:?usage: scripts/drift_qps.sh MODEL_BASE_PATH [ROUNDS] [SECONDS]}"
ROUNDS="${2:-3}"
SECONDS_PER_RUN="${3:-10}"
PY="${PY:-.venv/bin/python}"
CONNECTIONS="${CONNECTIONS:-8}"
tmp=$(mktemp -d)
trap 'kill $(cat "$tmp"/pid 2>/dev/null) 2>/dev/null || true; rm -rf "$tmp"' EXIT

# One instance of 128 features per request: the case where per-request overhead shows most.
"$PY" - "$tmp/post.lua" <<'EOF'
import json, random, sys
random.seed(0)
body = json.dumps({"instances": [[round(random.gauss(0, 1), 3) for _ in range(128)]]})
open(sys.argv[1], "w").write('wrk.method = "POST"\nwrk.body = ' + json.dumps(body) + '\nwrk.headers["Content-Type"] = "application/json"\n')
EOF

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime of the server process

port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
grpc=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for round in $(seq "$ROUNDS"); do
    for window in 10000 0; do
        "$PY" -m serving --host=127.0.0.1 --port="$grpc" --rest_api_port="$port" --model_name=ctr \
            --model_base_path="$BASE" --drift_window="$window" --log_level=warning > "$tmp/server.log" 2>&1 &
        echo $! > "$tmp/pid"
        until curl -sf "http://127.0.0.1:$port/v1/models/ctr" > /dev/null; do sleep 0.2; done
        wrk -t1 -c"$CONNECTIONS" -d2s -s "$tmp/post.lua" "http://127.0.0.1:$port/v1/models/ctr:predict" > /dev/null
        before=$(cpu_ticks "$(cat "$tmp/pid")")
        wrk -t1 -c"$CONNECTIONS" -d"${SECONDS_PER_RUN}s" -s "$tmp/post.lua" \
            "http://127.0.0.1:$port/v1/models/ctr:predict" > "$tmp/wrk.txt"
        after=$(cpu_ticks "$(cat "$tmp/pid")")
        qps=$(awk '/Requests\/sec/ {print $2}' "$tmp/wrk.txt")
        requests=$(awk '/requests in/ {print $1}' "$tmp/wrk.txt")
        # Server CPU time per request: what the QPS of a CPU-bound server comes down to, and far less
        # sensitive than QPS to other jobs on the machine.
        cpu_us=$(awk -v t=$((after - before)) -v n="$requests" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t / hz / n * 1e6}')
        rows=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^ctr_serving_drift_window_rows/ {print $2}')
        echo "round $round drift_window=$window qps=$qps cpu_us_per_request=$cpu_us window_rows=${rows:-off}" \
            | tee -a "$tmp/results"
        kill "$(cat "$tmp/pid")"; wait "$(cat "$tmp/pid")" 2>/dev/null || true
    done
done
for window in 10000 0; do
    for what in qps cpu_us_per_request; do
        grep "drift_window=$window " "$tmp/results" | sed "s/.* $what=\\([0-9.]*\\).*/\\1/" | sort -n \
            | awk -v w="$window" -v k="$what" '{a[NR]=$1} END {print "median " k " drift_window=" w ": " a[int((NR+1)/2)]}'
    done
done
