#!/usr/bin/env bash
# Create .venv (once) and install Sluice with its test extra.
# torch==2.13.0 goes in first when torch is missing, so the range in pyproject.toml never pulls another build.
# The install is skipped while .venv/.sluice-setup-stamp holds the hash of pyproject.toml and this script (written
# after a successful install); delete the stamp to force a reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STAMP=.venv/.sluice-setup-stamp
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" \
    >/dev/null 2>&1; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
want=$(cat pyproject.toml ops/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] \
    || ! .venv/bin/python -c "import importlib.metadata as m; m.version('sluice')" >/dev/null 2>&1; then
  rm -f "$STAMP"
  .venv/bin/pip install --quiet -e ".[test]"
  echo "$want" > "$STAMP"
fi
# System tools the tests use for real (the two-host test captures traffic between network namespaces, the
# partition test cuts the link between them with nftables, the Slurm test starts a one-node Slurm with munge).
# As root (CI), a missing one is installed from Debian's packages; otherwise the test that needs it says so.
missing=()
for tool in tcpdump:tcpdump ip:iproute2 nft:nftables promtool:prometheus munged:munge slurmctld:slurm-wlm \
    slurmd:slurm-wlm sbatch:slurm-wlm; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] \
    || [[ " ${missing[*]-} " == *" ${tool##*:} "* ]] || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
