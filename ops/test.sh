#!/usr/bin/env bash
# Set up, then run the whole test suite (unit, reference, integration and fault tests).
# --fast: the inner loop, the unit tests only (-m "not integration and not slow": no processes, no training runs).
# Other arguments go to pytest, e.g.: bash ops/test.sh -k assembler, bash ops/test.sh --fast tests/test_ppo.py
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
  if [ "$arg" = --fast ]; then args+=(-m "not integration and not slow"); else args+=("$arg"); fi
done
bash ops/setup.sh
exec .venv/bin/python -m pytest -q -ra --durations=15 ${args[@]+"${args[@]}"}
