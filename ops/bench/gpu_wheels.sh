#!/usr/bin/env bash
# Fetch, on a machine with pip access, the wheels ops/bench/gpu_check.sh needs on a GPU machine whose Python
# (3.12, PyTorch and numba already there) can reach no package index: pyzmq, gymnasium, pettingzoo, mpe2,
# multiprocess and their small dependencies, into .whl/ at the repository root (about 10 MB).
#   bash ops/bench/gpu_wheels.sh            # then carry .whl to the GPU machine with the working tree
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl pyzmq==27.3.0 gymnasium==1.4.0 pettingzoo==1.27.0 mpe2==1.1.1 multiprocess==0.70.19 dill==0.4.1 \
  farama-notifications==0.0.4 cloudpickle==3.1.3
ls -1 .whl
