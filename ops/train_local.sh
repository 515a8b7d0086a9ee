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
# Until the learner ends. The host is this run's only one: if it fails first (an env that cannot run, a worker in a
# crash loop, an opponent that cannot play the env), the learner would wait for hosts forever, so it is stopped too
# and the command exits with the host's code. A host stopped by SIGINT or SIGTERM (130, 143) is not a failure: the
# same signal stops the learner.
host_rc=
host_failed=
while kill -0 "$learner" 2>/dev/null; do
  if [ -z "$host_rc" ] && ! kill -0 "$actors" 2>/dev/null; then
    host_rc=0
    wait "$actors" || host_rc=$?
    case "$host_rc" in
      0|130|143) ;;
      *) host_failed=$host_rc
         echo "train_local: the actor host exited $host_rc (its reason is above); stopping the learner" >&2
         kill -TERM "$learner" 2>/dev/null || true ;;
    esac
  fi
  sleep 0.2 || true  # a Ctrl-C reaches this sleep too
done
rc=0
wait "$learner" || rc=$?
# A learner that finished sent the host SHUTDOWN; one that failed to start never will: give the host a moment to
# leave on its own, then stop it.
for _ in $(seq 50); do
  kill -0 "$actors" 2>/dev/null || break
  sleep 0.2 || true  # a Ctrl-C reaches this sleep too
done
kill -TERM "$actors" 2>/dev/null || true
wait "$actors" 2>/dev/null || true
trap - INT TERM
echo "train_local: learner exited $rc after ${SECONDS} s wall-clock (setup and start-up included)"
exit "${host_failed:-$rc}"
