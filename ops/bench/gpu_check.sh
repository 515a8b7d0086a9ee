#!/usr/bin/env bash
# The GPU path in one call (under 8 minutes): the CUDA tests, the learner update on cuda (fp32 and bf16, torch.compile
# off and on, with the compute floor where the card's peak is known), CartPole to 475 with the learner on cuda, and
# the actor pipeline with the gridworld's real CNN policy on the GPU (python -m actors --device cuda) beside the same
# on the CPU. Every step has its own time limit; one that fails or runs out is recorded and the next one runs.
# Writes one JSON object to $OUT/gpu_check.json ($OUT, else runs/): the card, each step's exit code, seconds, the
# JSON records its command printed and, for a step that failed, the end of its output.
#   bash ops/bench/gpu_wheels.sh                 # once, on a machine with pip access (fills .whl/)
#   bash ops/bench/gpu_check.sh                  # on the GPU machine, from the repository root (carry .whl)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
if ! "$PY" -c "import zmq, gymnasium, pettingzoo, multiprocess" 2>/dev/null; then  # a GPU machine without a
  # package index: install the wheels carried in .whl (ops/bench/gpu_wheels.sh)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sluice-site \
    .whl/*.whl || { echo "gpu_check.sh: packages missing and no usable .whl/ (run ops/bench/gpu_wheels.sh)" >&2; exit 2; }
  export PYTHONPATH=/tmp/sluice-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
gpu=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
if [ -z "$gpu" ]; then
  echo "gpu_check.sh: torch sees no CUDA device; run this on a GPU machine" >&2
  exit 2
fi
out_dir=${OUT:-runs}
mkdir -p "$out_dir"
logs=$(mktemp -d)
# dense peak TFLOP/s for the compute floor (fp32 without TF32, bf16 tensor cores): H100 / H200 SXM
case "$gpu" in
  *H100*|*H200*) peak_fp32=67; peak_bf16=989 ;;
  *) peak_fp32=""; peak_bf16="" ;;
esac
step() {  # step NAME SECONDS COMMAND...: run one step under its time limit, its output in $logs/NAME.log
  local name=$1 limit=$2 started=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit}s): $*" >&2
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  echo "$rc $((SECONDS - started))" >"$logs/$name.status"
  echo "   exit $rc" >&2
}
peak() { [ -n "$1" ] && echo "--peak-tflops $1"; }
step cuda_tests 90 "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/test_advantage.py tests/test_batch_staging.py \
  tests/test_optimizer_step.py tests/test_inference_device.py
# shellcheck disable=SC2046
step learner_update_fp32 100 "$PY" -m ops.bench.learner_update --config configs/grid_3agents.yaml --device cuda \
  --updates 10 --autocast none $(peak "$peak_fp32")
# shellcheck disable=SC2046
step learner_update_bf16 100 "$PY" -m ops.bench.learner_update --config configs/grid_3agents.yaml --device cuda \
  --updates 10 --autocast bf16 $(peak "$peak_bf16")
step cartpole_to_475_cuda 80 "$PY" -m ops.experiments.cartpole_to_475 --trials 1 --workers 4 --device cuda
step pipeline_cnn_actors_cuda 50 "$PY" -m ops.bench.pipeline --envs grid3 --async-factor 2 --pipeline-only \
  --seconds 10 --workers 8 --policy model --actor-device cuda
step pipeline_cnn_actors_cpu 50 "$PY" -m ops.bench.pipeline --envs grid3 --async-factor 2 --pipeline-only \
  --seconds 10 --workers 8 --policy model --actor-device cpu
"$PY" - "$logs" "$out_dir/gpu_check.json" "$gpu" <<'PYTHON'
import json, pathlib, platform, sys
logs, target, gpu = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
steps = {}
for status in sorted(logs.glob("*.status"), key=lambda p: p.stat().st_mtime):
    code, seconds = status.read_text().split()
    lines = status.with_suffix(".log").read_text(errors="replace").splitlines()
    records = []
    for line in lines:
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    steps[status.stem] = {"exit_code": int(code), "seconds": round(float(seconds), 1), "records": records,
                          **({} if code == "0" else {"output_tail": lines[-40:]})}
import torch
result = {"check": "gpu_check", "gpu": gpu, "torch": torch.__version__, "machine": platform.node(), "steps": steps,
          "all_passed": all(step["exit_code"] == 0 for step in steps.values())}
target.write_text(json.dumps(result, indent=1))
print(json.dumps({name: (step["exit_code"], step["seconds"]) for name, step in steps.items()}))
print(f"wrote {target}")
PYTHON
