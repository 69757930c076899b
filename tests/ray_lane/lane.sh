#!/usr/bin/env bash
# The Ray lane, inside a private network namespace that has only loopback (Ray listens on
# every interface, whatever address it is given):
#
#   ng-otel receive                 the OTLP receiver, over HTTP (python -m ng_otel.cli)
#   python gym_server.py            a Gym-shaped aiohttp server that fails, under ng_otel
#   python driver.py                a local Ray cluster: driver, actors, a task (tests/test_ray.py)
#
#   GYM_VENV=<venv with ray and ng_otel> OUT=<empty folder> bash lane.sh
#
# Everything it writes is under OUT; everything it starts dies with the namespace's PID 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${GYM_VENV:?}" "${OUT:?}"
LANE_TIMEOUT=${LANE_TIMEOUT:-300}

if [ -z "${NG_OTEL_RAY_LANE_IN_NAMESPACE:-}" ]; then
  exec timeout -k 10 "$LANE_TIMEOUT" unshare --net --pid --fork --mount-proc \
    env NG_OTEL_RAY_LANE_IN_NAMESPACE=1 bash "$0" "$@"
fi

set -o pipefail
ip link set lo up
started=$(date +%s.%N)
phase() { printf '[lane %6.1fs] %s\n' "$(echo "$(date +%s.%N) - $started" | bc)" "$*" | tee -a "$OUT/lane.log"; }
fail() { phase "FAILED: $*"; exit 1; }

export PATH="$GYM_VENV/bin:$PATH"
# Ray's sockets need a short path (AF_UNIX: 107 bytes).
RAY_TMPDIR=$(mktemp -d /tmp/ng-otel-ray.XXXXXX)
trap 'rm -rf "$RAY_TMPDIR"' EXIT
export HOME="$OUT/home" TMPDIR="$OUT/tmp" RAY_TMPDIR
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
mkdir -p "$HOME" "$TMPDIR"

free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port)
SERVER_PORT=$(free_port)

python -m ng_otel.cli receive --grpc-port 0 --http-port "$HTTP_PORT" --out "$OUT/otlp.jsonl" > "$OUT/receive.log" 2>&1 &
RECEIVER=$!
for _ in $(seq 100); do grep -q "$HTTP_PORT" "$OUT/receive.log" 2> /dev/null && break; sleep 0.1; done

export NG_OTEL_ENABLED=1
export OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf
export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$HTTP_PORT"
export OTEL_LOGS_EXPORTER=none
# Longer than the lane: spans leave a process only when something flushes it (a failure
# crossing, a graceful exit, the end), so what a killed actor held is lost for certain.
export OTEL_BSP_SCHEDULE_DELAY=600000
export OTEL_METRIC_EXPORT_INTERVAL=600000

python "$here/gym_server.py" "$SERVER_PORT" > "$OUT/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SERVER_PORT/ready" > /dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$SERVER_PORT/ready" > /dev/null || fail "the Gym-shaped server never answered: $(tail -20 "$OUT/server.log")"
phase "receiver on 127.0.0.1:$HTTP_PORT, Gym-shaped server on 127.0.0.1:$SERVER_PORT"

python "$here/driver.py" "http://127.0.0.1:$SERVER_PORT" "$OUT" > "$OUT/driver.log" 2>&1 \
  || fail "the driver failed: $(tail -40 "$OUT/driver.log")"
phase "driver done (Ray started in $(python -c "import json; print(json.load(open('$OUT/driver.json'))['ray_start_seconds'])") s)"

kill -TERM "$SERVER" 2> /dev/null
wait "$SERVER" 2> /dev/null
sleep 1
kill -TERM "$RECEIVER" 2> /dev/null
wait "$RECEIVER" 2> /dev/null
phase "done"
