#!/usr/bin/env bash
# Every throughput figure of Sluice in one run: one JSON object per benchmark on stdout (and in
# runs/bench-<time>.jsonl), progress on stderr. Sets up .venv first; the peer benchmarks build their own
# virtual environments under .bench/ (minutes, the first time). Close other work first: the figures are ratios
# taken on this machine, and anything else running skews them.
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
run() { echo "== $*" >&2; "$PY" "$@" | tee -a "$out"; }
run ops/bench/gridworld_steps.py
run ops/bench/spread_steps.py
run ops/bench/coma_step.py
run ops/bench/opponent_inference.py
run ops/bench/pipeline.py
run ops/bench/assembler_copy.py
run ops/bench/ingest.py
run ops/bench/learner_update.py --no-compile
run ops/bench/curve_cost.py
if [ "$peers" = 1 ]; then
  run ops/bench/peer_pufferlib.py
  run ops/bench/peer_sample_factory.py
fi
echo "all figures: $out" >&2
