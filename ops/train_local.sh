#!/usr/bin/env bash
# Set up, then train CartPole with a local learner and one actor host (2 env workers) as separate processes.
# Extra arguments go to the learner, e.g.: bash ops/train_local.sh --set trainer.total_timesteps=500000
# The actor host dials the address the learner binds, resolved from the same arguments (--set network.port=P,
# --set network.host=H, or a --config that sets them). SLUICE_WORKERS sets the host's env workers (default 2);
# SLUICE_SKIP_SETUP=1 skips ops/setup.sh (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SLUICE_SKIP_SETUP:-0}" != 1 ]; then
  bash ops/setup.sh
fi
PY=.venv/bin/python
WORKERS=${SLUICE_WORKERS:-2}
SECONDS=0
# The learner's control address as its own config resolves it. Arguments that do not resolve (a bad --set): the
# learner alone, which says why and exits.
if ! learner_url=$($PY -m learner --config configs/cartpole.yaml "$@" --print-config 2>/dev/null | $PY -c '
import sys, yaml
network = (yaml.safe_load(sys.stdin) or {}).get("network") or {}
host = str(network.get("host", "127.0.0.1"))
host = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
print("tcp://%s:%s" % ("[%s]" % host if ":" in host else host, network.get("port", 5555)))
'); then
  exec $PY -m learner --config configs/cartpole.yaml "$@"
fi
echo "train_local: actor host dials the learner at $learner_url"
$PY -m learner --config configs/cartpole.yaml "$@" &
learner=$!
$PY -m actors --n "$WORKERS" --learner "$learner_url" &
actors=$!
stop() { kill -TERM "$learner" "$actors" 2>/dev/null || true; }
trap stop INT TERM
rc=0
wait "$learner" || rc=$?
if kill -0 "$learner" 2>/dev/null; then  # the wait above ended on a signal (trap stop): wait for the exit code
  rc=0
  wait "$learner" || rc=$?
fi
# A learner that finished sent the host SHUTDOWN; one that failed to start never will: give the host a moment to
# leave on its own, then stop it.
for _ in $(seq 50); do
  kill -0 "$actors" 2>/dev/null || break
  sleep 0.2
done
kill -TERM "$actors" 2>/dev/null || true
wait "$actors" || true
trap - INT TERM
echo "train_local: learner exited $rc after ${SECONDS} s wall-clock (setup and start-up included)"
exit "$rc"
