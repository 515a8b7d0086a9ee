#!/usr/bin/env bash
# Set up, then train CartPole with a local learner and one actor host (2 env workers) as separate processes.
# Extra arguments go to the learner, e.g.: bash ops/train_local.sh --set trainer.total_timesteps=500000
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/setup.sh
PY=.venv/bin/python
WORKERS=${SLUICE_WORKERS:-2}
SECONDS=0
$PY -m learner --config configs/cartpole.yaml "$@" &
learner=$!
$PY -m actors --n "$WORKERS" &
actors=$!
stop() { kill -TERM "$learner" "$actors" 2>/dev/null || true; }
trap stop INT TERM
rc=0
wait "$learner" || rc=$?
wait "$actors" || true
trap - INT TERM
echo "train_local: learner exited $rc after ${SECONDS} s wall-clock (setup and start-up included)"
exit "$rc"
