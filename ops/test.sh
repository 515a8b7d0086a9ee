#!/usr/bin/env bash
# Set up, then run the whole test suite (unit, reference, integration and fault tests).
# Extra arguments go to pytest, e.g.: bash ops/test.sh -k assembler
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/setup.sh
exec .venv/bin/python -m pytest -q -ra --durations=15 "$@"
