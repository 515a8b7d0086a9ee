"""Peer benchmark: PufferLib's vectorisation (pufferlib-core, Multiprocessing backend) against our actor host.

Same envs (our own numba CartPole / gridworld code, built by ``envs.registry.make_vec_env`` from the
same run configs), same number of worker processes, same number of envs per worker, same machine, one run:

* **PufferLib**: ``ops/bench/pufferlib_side.py`` (``-m ops.bench.pufferlib_side``) runs in its own virtual
  environment (``.bench/pufferlib-venv``, created here, idempotently, with ``pufferlib-core`` from PyPI; no peer
  code is vendored). It wraps one batch of our envs per worker as a native ``pufferlib.PufferEnv`` (zero-copy: our
  env writes straight into PufferLib's shared-memory buffers) and steps it with ``pufferlib.vector.Multiprocessing``
  and uniformly random actions drawn per step in the main process, in two settings: ``sync`` (batch_size =
  num_envs) and ``async`` (batch_size = num_envs / 2, PufferLib's double-buffered EnvPool mode).
* **ours**: ``ops/bench/pipeline.py`` (``-m ops.bench.pipeline``, our venv): a real ``python -m actors
  --null-policy`` host with worker processes, shared memory, the assembler and a ZeroMQ sink, for each
  ``--async-factor``.

Prints one JSON object per line: every PufferLib run (``"bench": "pufferlib_multiprocessing"``), every record
pipeline.py prints (``"bench": "pipeline"``), and per env a summary (``"bench": "peer_pufferlib"``) with
``ratio = ours / pufferlib`` (best setting of each side; target >= 1.0). Progress goes to stderr.

Usage: .venv/bin/python -m ops.bench.peer_pufferlib [--envs cartpole grid3 grid24] [--workers 2]
       [--envs-per-worker N | NAME=N ...] [--seconds 5] [--rounds 1] [--async-factor 2 1]
       [--skip-ours] [--skip-peer] [--setup-only]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from ops.benchlib import emit

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".bench" / "pufferlib-venv"
PEER_PY = VENV / "bin" / "python"
OUR_PY = REPO / ".venv" / "bin" / "python"
SIDE = "ops.bench.pufferlib_side"
"""The peer's side, run as a module by the peer venv's interpreter from the repository root."""
PIPELINE = "ops.bench.pipeline"
"""Our side, run as a module by our venv's interpreter from the repository root."""

PUFFERLIB = "pufferlib-core==3.0.23"
TORCH = "torch==2.13.0"
"""pufferlib/__init__.py imports pufferlib.models and pufferlib.pytorch, hence torch; the CPU wheel of the version
our venv uses (pufferlib-core's own pin, torch==2.9.0, would pull GBs of CUDA wheels, so it is installed
--no-deps). Its other requirements (rich, rich-argparse, nvidia-ml-py, pyro-ppl) serve its
trainer and CLI only; the vector module needs numpy, gymnasium and psutil."""
ENV_CODE_DEPS = ("numpy", "numba", "gymnasium", "pyyaml", "pettingzoo", "psutil")
"""What `envs.registry` (our env code and its adapters), `configs.loader` and pufferlib.vector import;
numpy/numba/gymnasium/pettingzoo pinned to the versions of our own venv so both sides run the same kernels."""

ENV_NAMES = ("cartpole", "grid3", "grid24")
DEFAULT_ENVS_PER_WORKER = {"cartpole": 64, "grid3": 170, "grid24": 20}
"""What the run configs plan with 2 workers and async_factor 2 (configs.plan.make_plan: cartpole.yaml,
grid_3agents.yaml, grid_24agents.yaml); both sides get the same number, given explicitly."""
TARGET_RATIO = 1.0


def log(message: str) -> None:
    print(f"[peer_pufferlib] {message}", file=sys.stderr, flush=True)


# -- the peer's virtual environment -------------------------------------------------------------------------

def _pinned(name: str) -> str:
    """``name==<version in this interpreter>`` when installed here (our venv), else ``name``."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def _requirements() -> list[list[str]]:
    """The pip install commands, in order (torch first, then pufferlib-core without its pins)."""
    return [[TORCH], ["--no-deps", PUFFERLIB], [_pinned(name) for name in ENV_CODE_DEPS],
            ["--no-deps", "-e", str(REPO)]]


def _venv_ready(stamp: Path, wanted: str) -> bool:
    if not PEER_PY.exists() or not stamp.exists() or stamp.read_text() != wanted:
        return False
    check = subprocess.run([str(PEER_PY), "-c", "import pufferlib.vector, envs.registry, configs.loader"],
                           cwd="/", capture_output=True, text=True)
    if check.returncode != 0:
        log(f"peer venv exists but does not import: {check.stderr.strip().splitlines()[-1:]}")
    return check.returncode == 0


def ensure_peer_venv() -> None:
    """Create .bench/pufferlib-venv with pufferlib-core and our env code, unless it is already there."""
    stamp = VENV / ".sluice-peer-requirements.json"
    wanted = json.dumps(_requirements())
    if _venv_ready(stamp, wanted):
        log(f"peer venv ready: {VENV}")
        return
    log(f"creating peer venv {VENV}")
    VENV.parent.mkdir(parents=True, exist_ok=True)
    if not PEER_PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, stdout=sys.stderr)
    pip = [str(PEER_PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    log("pip will list pufferlib-core's unmet pins (torch==2.9.0, rich, rich-argparse, nvidia-ml-py, pyro-ppl) "
        "as dependency conflicts: expected, they are left out on purpose")
    for args in _requirements():
        log("pip install " + " ".join(args))
        subprocess.run(pip + args, check=True, stdout=sys.stderr, stderr=sys.stderr)
    stamp.write_text(wanted)
    if not _venv_ready(stamp, wanted):
        raise SystemExit("peer venv was built but `import pufferlib.vector, envs.registry` fails")


# -- runs -----------------------------------------------------------------------------------------------------

def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _pufferlib_processes() -> list[int]:
    """PIDs of live processes running pufferlib_side (its Multiprocessing workers are forks of it)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if SIDE.encode() in cmdline.read_bytes():
                pid = int(cmdline.parent.name)
                if pid != os.getpid() and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(pid)
        except (OSError, IndexError):
            continue
    return pids


def run_peer(env: str, workers: int, envs_per_worker: int, mode: str, seconds: float, warmup: float) -> dict:
    """One PufferLib measurement in the peer venv; afterwards no process of it may remain."""
    cmd = [str(PEER_PY), "-m", SIDE, "--env", env, "--workers", str(workers), "--envs-per-worker",
           str(envs_per_worker), "--mode", mode, "--seconds", str(seconds), "--warmup", str(warmup)]
    log(" ".join(cmd[1:]))
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    try:
        out, _ = proc.communicate(timeout=warmup + seconds + 180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    leftover = _pufferlib_processes()
    for pid in leftover:  # workers of the run we started that outlived it
        log(f"killing leftover PufferLib process {pid}")
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    if proc.returncode != 0:
        raise SystemExit(f"pufferlib_side.py failed for {env} ({mode}), exit {proc.returncode}")
    record = _json_lines(out)[-1]
    record["leftover_processes_after_exit"] = leftover
    return record


def run_ours(env: str, workers: int, envs_per_worker: int, seconds: float, async_factors: list[int],
             pipeline_only: bool) -> list[dict]:
    """pipeline.py (our venv) for one env: one record per async factor."""
    cmd = [str(OUR_PY), "-m", PIPELINE, "--envs", env, "--workers", str(workers), "--envs-per-worker",
           str(envs_per_worker), "--seconds", str(seconds), "--async-factor", *map(str, async_factors)]
    if pipeline_only:
        cmd.append("--pipeline-only")
    log(" ".join(cmd[1:]))
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
                          timeout=len(async_factors) * (4 * seconds + 300))
    if proc.returncode != 0:
        raise SystemExit(f"pipeline.py failed for {env}, exit {proc.returncode}")
    return [r for r in _json_lines(proc.stdout) if r.get("bench") == "pipeline"]


def summary(env: str, workers: int, envs_per_worker: int, peer: list[dict], ours: list[dict]) -> dict:
    """Best PufferLib setting against our best pipeline setting on one env."""
    record: dict = {"bench": "peer_pufferlib", "env": env, "workers": workers, "envs_per_worker": envs_per_worker,
                    "total_envs": workers * envs_per_worker, "policy": "null (uniformly random actions)"}
    best_peer = max(peer, key=lambda r: r["pufferlib_agent_steps_per_s"]) if peer else None
    for mode in ("sync", "async"):
        runs = [r["pufferlib_agent_steps_per_s"] for r in peer if r["mode"] == mode]
        if runs:
            record[f"pufferlib_{mode}_agent_steps_per_s"] = max(runs)
    if best_peer:
        record.update(agents_per_env=best_peer["agents_per_env"], pufferlib_version=best_peer["pufferlib_version"],
                      pufferlib_agent_steps_per_s=best_peer["pufferlib_agent_steps_per_s"],
                      pufferlib_mode=best_peer["mode"], pufferlib_batch_size=best_peer["pufferlib_batch_size"],
                      pufferlib_leftover_processes=sorted({p for r in peer for p in r["leftover_processes_after_exit"]}
                                                          | {p for r in peer for p in r["leftover_worker_pids"]}))
    best_ours = max(ours, key=lambda r: r["pipeline_agent_steps_per_s"]) if ours else None
    for af in sorted({r["async_factor"] for r in ours}):
        runs = [r for r in ours if r["async_factor"] == af]
        record[f"ours_async_factor_{af}_agent_steps_per_s"] = max(r["pipeline_agent_steps_per_s"] for r in runs)
        raw = [r["raw_agent_steps_per_s"] for r in runs if "raw_agent_steps_per_s" in r]
        if raw:
            record[f"raw_async_factor_{af}_agent_steps_per_s"] = max(raw)
    if best_ours:
        record.update(ours_agent_steps_per_s=best_ours["pipeline_agent_steps_per_s"],
                      ours_async_factor=best_ours["async_factor"])
        if best_ours.get("envs_per_worker") != envs_per_worker:
            record["warning"] = (f"pipeline.py ran {best_ours.get('envs_per_worker')} envs per worker, "
                                 f"PufferLib {envs_per_worker}")
    if best_peer and best_ours:
        record["ratio"] = round(best_ours["pipeline_agent_steps_per_s"] / best_peer["pufferlib_agent_steps_per_s"], 3)
        record["target_ratio"] = TARGET_RATIO
        record["meets_target"] = record["ratio"] >= TARGET_RATIO
    record["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    return record


def _envs_per_worker(values: list[str] | None, envs: list[str]) -> dict[str, int]:
    sizes = {env: DEFAULT_ENVS_PER_WORKER[env] for env in envs}
    for value in values or []:
        if "=" in value:
            name, _, n = value.partition("=")
            if name not in sizes:
                raise SystemExit(f"--envs-per-worker {value}: {name!r} is not one of --envs {envs}")
            sizes[name] = int(n)
        else:
            sizes = {env: int(value) for env in envs}
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ENV_NAMES), choices=ENV_NAMES)
    parser.add_argument("--workers", type=int, default=2, help="env worker processes on both sides")
    parser.add_argument("--envs-per-worker", nargs="+", metavar="N|NAME=N",
                        help=f"envs per worker on both sides (default {DEFAULT_ENVS_PER_WORKER})")
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement window of each run")
    parser.add_argument("--warmup", type=float, default=2.0, help="PufferLib warm-up before the window")
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"],
                        help="PufferLib settings: sync (batch_size = num_envs), async (batch_size = num_envs / 2)")
    parser.add_argument("--async-factor", type=int, nargs="+", default=[2, 1], help="our settings (pipeline.py)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat everything, interleaved; best of each side")
    parser.add_argument("--pipeline-only", action="store_true", help="pass --pipeline-only to pipeline.py (no raw)")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--setup-only", action="store_true", help="build the peer venv and exit")
    args = parser.parse_args()
    sizes = _envs_per_worker(args.envs_per_worker, args.envs)
    for env, n in sizes.items():
        for af in args.async_factor:
            if not args.skip_ours and n % af:
                parser.error(f"envs per worker for {env} ({n}) must be divisible by async factor {af}")
    if not args.skip_peer:
        ensure_peer_venv()
    if args.setup_only:
        return
    peer: dict[str, list[dict]] = {env: [] for env in args.envs}
    ours: dict[str, list[dict]] = {env: [] for env in args.envs}
    for _ in range(args.rounds):
        for env in args.envs:
            if not args.skip_peer:
                for mode in args.modes:
                    record = run_peer(env, args.workers, sizes[env], mode, args.seconds, args.warmup)
                    peer[env].append(record)
                    emit(record)
            if not args.skip_ours:
                for record in run_ours(env, args.workers, sizes[env], args.seconds, args.async_factor,
                                       args.pipeline_only):
                    ours[env].append(record)
                    emit(record)
    for env in args.envs:
        emit(summary(env, args.workers, sizes[env], peer[env], ours[env]))
    leftover = _pufferlib_processes()
    if leftover:
        log(f"PufferLib processes still alive at exit: {leftover}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
