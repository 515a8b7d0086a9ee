#!/usr/bin/env bash
# Create .venv (once) and install Sluice with its test extra.
# torch==2.13.0 goes in first when torch is missing, so the range in pyproject.toml never pulls another build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
.venv/bin/pip install --quiet -e ".[test]"
