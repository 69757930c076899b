#!/usr/bin/env bash
# A NeMo Gym 0.7.0 deployment as its docs start one, inside a private network namespace that
# has only loopback (Ray listens on every interface, whatever address it is given):
#
#   ng-otel receive                                   the OTLP receiver, over gRPC
#   opentelemetry-instrument -- gym env start ...     five stock servers, the head server, Ray
#   opentelemetry-instrument -- gym eval run ...      rollout collection, failures to the sidecar
#   ng-otel replay <the rows>                         into the receiver that saw the live run
#
# against tests/real_gym/fake_openai.py, which fails on the cues in tests/real_gym/tasks.jsonl.
# One rollout never ends (its model drops every connection and Gym retries forever): once
# every other rollout has its row, the lane waits two export intervals, copies what the
# receiver holds (during.jsonl: what arrived while Gym was still retrying), and stops
# collection as Ctrl-C does.
#
#   GYM_VENV=<venv with nemo-gym and ng_otel> OUT=<empty folder> bash gym_env_lane.sh
#
# Everything it writes is under OUT; everything it starts dies with the namespace's PID 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
: "${GYM_VENV:?}" "${OUT:?}"
LANE_TIMEOUT=${LANE_TIMEOUT:-420}
ROWS_TIMEOUT=${ROWS_TIMEOUT:-150}

if [ -z "${NG_OTEL_LANE_IN_NAMESPACE:-}" ]; then
  exec timeout -k 10 "$LANE_TIMEOUT" unshare --net --pid --fork --mount-proc \
    env NG_OTEL_LANE_IN_NAMESPACE=1 bash "$0" "$@"
fi

set -o pipefail
ip link set lo up
started=$(date +%s.%N)
phase() { printf '[lane %6.1fs] %s\n' "$(echo "$(date +%s.%N) - $started" | bc)" "$*" | tee -a "$OUT/lane.log"; }
fail() { phase "FAILED: $*"; exit 1; }

export PATH="$GYM_VENV/bin:$PATH"
# Ray and Gym write under HOME and TMPDIR; Ray's sockets need a short path (AF_UNIX: 107 bytes).
RAY_TMPDIR=$(mktemp -d /tmp/ng-otel-ray.XXXXXX)
trap 'rm -rf "$RAY_TMPDIR"' EXIT
export HOME="$OUT/home" TMPDIR="$OUT/tmp" RAY_TMPDIR
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
mkdir -p "$HOME" "$TMPDIR" "$OUT/work" "$OUT/venvs" "$OUT/run"
cd "$OUT/work"  # Gym's working folder for a wheel install: its cache/ and results/ land here

# Gym's prebuilt-venv mode: each server's venv (<uv_venv_dir>/<type>/<name>/.venv) is the
# one venv that has Gym and ng_otel, so nothing is installed inside the namespace.
for server in resources_servers/simpleqa responses_api_models/openai_model \
  responses_api_agents/simple_agent environment_servers/legacy_agent; do
  mkdir -p "$OUT/venvs/$server" && ln -sfn "$GYM_VENV" "$OUT/venvs/$server/.venv"
done

free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
GRPC_PORT=$(free_port)
FAKE_PORT=$(free_port)
HEAD_PORT=$(free_port)

ng-otel receive --grpc-port "$GRPC_PORT" --http-port 0 --out "$OUT/otlp.jsonl" > "$OUT/receive.log" 2>&1 &
RECEIVER=$!
python "$here/fake_openai.py" "$FAKE_PORT" "$OUT/fake_requests.jsonl" > "$OUT/fake.log" 2>&1 &
FAKE=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$FAKE_PORT/v1/models" > /dev/null && break; sleep 0.1; done
for _ in $(seq 100); do grep -q "$GRPC_PORT" "$OUT/receive.log" 2> /dev/null && break; sleep 0.1; done
phase "receiver on 127.0.0.1:$GRPC_PORT, fake endpoint on 127.0.0.1:$FAKE_PORT"

# What docs/gym.md tells a user to set where Gym starts.
export NG_OTEL_ENABLED=1
export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$GRPC_PORT"
export OTEL_LOGS_EXPORTER=none
export OTEL_BSP_SCHEDULE_DELAY=500          # the span processor's schedule delay
export OTEL_METRIC_EXPORT_INTERVAL=1000     # and the metric export interval: the lane's export interval
export NG_OTEL_STALL_SECONDS=6             # policy_drops, which never answers, is stalled after 6 s

start_gym() {
  set -m  # its own process group, with SIGINT live: how a terminal's Ctrl-C reaches every Gym process
  opentelemetry-instrument -- gym env start \
    --resources-server simpleqa --model-type openai_model --config "$here/judge_model.yaml" \
    --model-url "http://127.0.0.1:$FAKE_PORT/v1" --model-api-key dummy --model fake-policy \
    "+head_server.port=$HEAD_PORT" +skip_venv_if_present=true "+uv_venv_dir=$OUT/venvs" \
    +server_spinup_timeout_seconds=200 +model_endpoint_readiness_timeout_seconds=30 \
    > "$OUT/env_start.log" 2>&1 &
  GYM=$!
  set +m
}

# The head server's port is free when it is chosen, and Gym starts Ray before the head server
# binds it: Ray's GCS once took that very port (kernel-chosen), the head server failed to bind,
# and `gym env start` went on waiting for it. Then the deployment starts again on another port.
head_port_lost() { grep -q "error while attempting to bind on address ('127.0.0.1', $HEAD_PORT)" "$OUT/env_start.log"; }
for attempt in 1 2 3; do
  start_gym
  for _ in $(seq 400); do
    # bounded: whatever holds the port may never answer
    curl -sf --max-time 2 "http://127.0.0.1:$HEAD_PORT/readyz" > /dev/null 2>&1 && break
    head_port_lost && break
    kill -0 "$GYM" 2> /dev/null || fail "gym env start exited: $(tail -30 "$OUT/env_start.log")"
    sleep 0.5
  done
  head_port_lost || break
  [ "$attempt" -lt 3 ] || fail "the head server's port was taken three times: $(tail -30 "$OUT/env_start.log")"
  phase "attempt $attempt: the head server's port $HEAD_PORT was taken before it bound it; starting again"
  kill -INT -- "-$GYM" 2> /dev/null
  for _ in $(seq 60); do kill -0 "$GYM" 2> /dev/null || break; sleep 0.5; done
  kill -KILL -- "-$GYM" 2> /dev/null
  ray stop --force > /dev/null 2>&1  # Ray's own processes, in this PID namespace only
  mv "$OUT/env_start.log" "$OUT/env_start.$attempt.log"
  HEAD_PORT=$(free_port)
done
curl -sf "http://127.0.0.1:$HEAD_PORT/readyz" > /dev/null || fail "gym env start never ready: $(tail -30 "$OUT/env_start.log")"
ps -eo pid,ppid,args --forest > "$OUT/processes.txt"
phase "gym env start ready"

set -m
opentelemetry-instrument -- gym eval run --no-serve "+head_server.port=$HEAD_PORT" \
  --agent simpleqa_simple_agent --input "$here/tasks.jsonl" --output "$OUT/run/rollouts.jsonl" \
  +route_failures_to_sidecar=true > "$OUT/eval_run.log" 2>&1 &
COLLECT=$!
set +m
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
waited=0
# healthy and policy_drops_twice are scored; policy_500 and judge_503 go to the sidecar.
until [ "$(lines "$OUT/run/rollouts.jsonl")" -ge 2 ] && [ "$(lines "$OUT/run/rollouts_failures.jsonl")" -ge 2 ]; do
  kill -0 "$COLLECT" 2> /dev/null || fail "gym eval run exited early: $(tail -30 "$OUT/eval_run.log")"
  [ "$waited" -ge "$((ROWS_TIMEOUT * 2))" ] && fail "rows never written: $(tail -30 "$OUT/eval_run.log")"
  sleep 0.5
  waited=$((waited + 1))
done
phase "four of five rollouts have their rows; policy_drops is still being retried"
for _ in $(seq 40); do grep -q '"ng.rollout.stalled"' "$OUT/otlp.jsonl" 2> /dev/null && break; sleep 0.5; done
phase "policy_drops is stalled"
sleep 2  # two export intervals
cp "$OUT/otlp.jsonl" "$OUT/during.jsonl"
date +%s.%N > "$OUT/during.time"
phase "receiver copied while Gym retries ($(lines "$OUT/during.jsonl") requests)"
sleep 2  # Gym goes on retrying: the fake's request log shows it

kill -INT -- "-$COLLECT" 2> /dev/null
for _ in $(seq 60); do kill -0 "$COLLECT" 2> /dev/null || break; sleep 0.5; done
kill -INT -- "-$GYM" 2> /dev/null
for _ in $(seq 90); do kill -0 "$GYM" 2> /dev/null || break; sleep 0.5; done
kill -0 "$GYM" 2> /dev/null && fail "gym env start ignored SIGINT"
phase "collection and gym env start stopped"

ng-otel replay "$OUT/run/rollouts_failures.jsonl" > "$OUT/replay_failures.log" 2>&1
echo "exit $?" >> "$OUT/replay_failures.log"
ng-otel replay "$OUT/run/rollouts.jsonl" > "$OUT/replay_rows.log" 2>&1
echo "exit $?" >> "$OUT/replay_rows.log"
phase "rows replayed into the receiver that saw the live run"

sleep 1
kill -TERM "$RECEIVER" "$FAKE" 2> /dev/null
wait "$RECEIVER" 2> /dev/null
phase "done"
