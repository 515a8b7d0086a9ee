#!/usr/bin/env bash
# Every throughput figure of Sluice in one run: one JSON object per benchmark on stdout (and in
# runs/bench-<time>.jsonl), progress on stderr. Each is `python -m ops.bench.<name>` from the repository root
# (ops/bench/README.md: which figure each prints and where it is cited; the learning results: ops/experiments).
# Sets up .venv first; the peer benchmarks build their own virtual environments under .bench/ (minutes, the first
# time). Close other work first: the figures are ratios taken on this machine, and anything else running skews them.
#   bash ops/bench/run_all.sh            # everything (about 15 minutes on 2 cores, plus peer installs)
#   bash ops/bench/run_all.sh --no-peers # ours only
set -euo pipefail
cd "$(dirname "$0")/../.."
peers=1
for arg in "$@"; do
  case "$arg" in
    --no-peers) peers=0 ;;
    *) echo "run_all.sh: unknown argument '$arg' (allowed: --no-peers)" >&2; exit 2 ;;
  esac
done
bash ops/setup.sh >&2
mkdir -p runs
out="runs/bench-$(date +%Y%m%d-%H%M%S).jsonl"
PY=.venv/bin/python
run() { echo "== python -m ops.bench.$*" >&2; "$PY" -m "ops.bench.$1" "${@:2}" | tee -a "$out"; }
run gridworld_steps
run spread_steps
run coma_step
run opponent_inference
run pipeline
run assembler_copy
run ingest
run learner_update --no-compile
run curve_cost
if [ "$peers" = 1 ]; then
  run peer_pufferlib
  run peer_sample_factory
fi
echo "all figures: $out" >&2
