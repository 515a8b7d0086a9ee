"""Benchmark against a peer: Sample Factory's APPO vs Sluice on CartPole, env steps/s and wall-clock to 475.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python -m ops.bench.peer_sample_factory [--trials N] [--timeout-s S] [--sf-models matched,example]
                                                      [--skip-sf] [--skip-ours]

What it does, per trial and one run at a time (never two trainings at once):

1. Sets up (idempotently) the peer in its own virtual environment, ``.bench/sample-factory-venv``
   (gitignored): ``torch==2.13.0`` first (the CPU build), then ``sample-factory==2.1.1`` with its own
   dependencies (gymnasium 0.29.1 among them). No peer code is vendored: this file only drives SF's public
   API (``make_runner`` plus an ``AlgoObserver``) when it re-runs itself under that venv's interpreter.
2. Sample Factory: APPO as in its ``sf_examples/train_gym_env.py`` CartPole example (2 rollout workers x
   20 envs, 2 policy workers, batch 512, reward_scale 0.1, no RNN, no V-trace), on CPU, with the encoder
   set to our MLP: separate actor and critic towers (``--actor_critic_share_weights False``) of
   ``--encoder_mlp_layers 32 32`` with tanh, as ``policies/mlp.py`` builds for ``configs/cartpole.yaml``.
   The observer stops training once the mean of SF's last 100 episode returns reaches 475. A second SF
   run (``--sf-models ...,example``) keeps the example's own model (encoder 512, 512, elu, shared) as a
   time-to-475 reference: with our small MLP, SF's example hyperparameters (lr 1e-4) may not reach 475
   within the timeout.
3. Sluice: the learner and one actor host (``--n 2``) as separate processes, exactly like
   ``ops/experiments/cartpole_to_475.py``, twice: on ``env.name: gymnasium`` + ``env.gym_id: CartPole-v1``
   (the same env as SF's side) and on the built-in numba port (``configs/cartpole.yaml`` as is).

Figures (one JSON object per line on stdout; progress on stderr):

- ``seconds_to_475``: wall-clock from launching the system's processes until the system reports that the
  mean of its last 100 episode returns is >= 475 (null when not reached within ``--timeout-s``); each
  system's own training clock is given as well (``train_clock_s_to_475``).
- ``env_steps_per_s``: env steps per second while training, (steps at the last report - steps at the first
  report) / time between them, from SF's per-training-iteration counter and from our ``metrics.jsonl``
  (``env_steps``, ``elapsed_s``); ``env_steps_per_s_overall`` divides all steps by ``seconds_to_475``.
- The summary's ``ratio_env_steps_per_s`` is ours/SF on the same Gymnasium CartPole-v1 with the same MLP
  (target >= 1.5); ``ratio_env_steps_per_s_numba`` puts our built-in numba CartPole against SF's Gymnasium
  one. The two sides use different gymnasium releases (each venv's own), same CartPole-v1 dynamics.
- ``loadavg_1m_at_end`` is recorded per run: other load on the machine skews every figure.

Every figure comes from one invocation on one machine; medians over trials are in the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".bench" / "sample-factory-venv"
TORCH_REQ = "torch==2.13.0"
SF_REQ = "sample-factory==2.1.1"
TARGET = 475.0
GYM_ID = "CartPole-v1"
SF_MLP = [32, 32]  # policies/mlp.py for configs/cartpole.yaml: 2 tanh layers of 32, separate critic torso
SF_WORKERS, SF_ENVS_PER_WORKER = 2, 20
OUR_WORKERS = 2
OUR_SOLVED = re.compile(r"solved: mean return ([\d.]+) .* after ([\d,]+) (?:agent|env) steps in ([\d.]+) s "
                        r"\((\d+) updates\)")
SF_MARK = "PEER_SF_JSON "


def log(message: str) -> None:
    """Progress to stderr (stdout carries JSON only)."""
    print(f"[peer_sample_factory] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------
# Runs inside Sample Factory's venv (``python peer_sample_factory.py --sf-driver <SF args>``).
# --------------------------------------------------------------------------------------------------------

def make_gym_env(full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: str | None = None):
    """SF's env factory (module level so SF's spawned workers can unpickle it)."""
    import gymnasium

    return gymnasium.make(full_env_name, render_mode=render_mode)


def sf_driver(argv: list[str]) -> int:
    """Train SF's APPO with ``argv``; stop at a last-100 mean return >= TARGET; print marked JSON lines.

    ``argv[0]`` is the wall-clock limit in seconds, the rest goes to SF's argument parser.
    """
    timeout_s, argv = float(argv[0]), argv[1:]
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner

    def say(kind: str, **fields: Any) -> None:
        print(SF_MARK + json.dumps({"kind": kind, **fields}), flush=True)

    class SolveObserver(AlgoObserver):
        """Samples (time, env steps) every training iteration and stops training at the target."""

        def __init__(self) -> None:
            self.started = time.monotonic()
            self.samples: list[tuple[float, int]] = []
            self.solved: dict | None = None

        def on_start(self, runner: Any) -> None:
            self.started = time.monotonic()

        def on_training_step(self, runner: Any, training_iteration_since_resume: int) -> None:
            if self.solved is not None:  # stopping takes a few iterations; keep the window ending at 475
                return
            now = time.monotonic()
            steps = int(runner.env_steps.get(0, 0))
            self.samples.append((now, steps))
            if self.solved is None and now - self.started > timeout_s and not runner.stopped:
                runner._stop_training()  # SF's own --train_for_seconds clock runs slow; this one is wall-clock
                return
            rewards = runner.policy_avg_stats.get("reward", [[]])[0]
            if self.solved is None and len(rewards) >= 100:
                mean = float(sum(list(rewards)[-100:]) / 100)
                if mean >= TARGET:
                    self.solved = {"mean_return": mean, "env_steps": steps, "train_clock_s": now - self.started,
                                   "iterations": training_iteration_since_resume}
                    say("solved", **self.solved)
                    runner._stop_training()  # the same call SF makes when train_for_seconds runs out

    register_env(GYM_ID, make_gym_env)
    parser, _ = parse_sf_args(argv=argv)
    cfg = parse_full_cfg(parser, argv)
    cfg, runner = make_runner(cfg)
    observer = SolveObserver()
    runner.register_observer(observer)
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    rewards = list(runner.policy_avg_stats.get("reward", [[]])[0])
    main_loop_s = float(getattr(runner.timing, "main_loop", 0.0) or 0.0)
    say("result", status=int(status), samples=observer.samples, solved=observer.solved,
        env_steps=int(runner.env_steps.get(0, 0)), main_loop_s=main_loop_s,
        sf_fps=(runner.total_env_steps_since_resume or 0) / main_loop_s if main_loop_s else None,
        last_mean_return=float(sum(rewards[-100:]) / len(rewards[-100:])) if rewards else None,
        episodes_in_window=len(rewards))
    return 0


# --------------------------------------------------------------------------------------------------------
# Runs in the project's venv.
# --------------------------------------------------------------------------------------------------------

def venv_python() -> Path:
    return VENV / "bin" / "python"


def installed_versions() -> dict[str, str] | None:
    """Versions of torch, sample-factory and gymnasium in the peer venv (None when not all there)."""
    if not venv_python().exists():
        return None
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({p: m.version(p) for p in ('torch', 'sample-factory', 'gymnasium')}))")
    probe = subprocess.run([str(venv_python()), "-c", code], capture_output=True, text=True)
    return json.loads(probe.stdout) if probe.returncode == 0 else None


def pip(*args: str) -> None:
    cmd = [str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd))
    done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if done.returncode:
        raise SystemExit(f"pip failed ({done.returncode}): {' '.join(cmd)}")


def ensure_peer_venv() -> dict[str, str]:
    """Create .bench/sample-factory-venv if needed: torch==2.13.0 first (CPU wheel), then sample-factory."""
    versions = installed_versions()
    want_sf = SF_REQ.split("==")[1]
    if versions and versions["sample-factory"] == want_sf and versions["torch"].startswith("2.13.0"):
        log(f"peer venv ready: {VENV} {versions}")
        return versions
    if not venv_python().exists():
        log(f"creating {VENV}")
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip(TORCH_REQ)
    # torch pinned again so that pip can only keep the CPU build it has, never fetch another one
    pip(SF_REQ, TORCH_REQ)
    versions = installed_versions()
    if not versions:
        raise SystemExit(f"peer venv {VENV} is not usable after installing")
    log(f"peer venv ready: {VENV} {versions}")
    return versions


class Proc:
    """A child in its own session (process group), its merged output read line by line with timestamps."""

    def __init__(self, cmd: list[str], *, cwd: Path, env: dict[str, str], capture: bool = True) -> None:
        self.started = time.monotonic()
        self.popen = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True, text=True,
                                      stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT if capture else subprocess.DEVNULL)
        self.lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self.tail: list[str] = []
        if capture:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))
        self.lines.put(None)

    def next_line(self, deadline: float) -> tuple[float, str] | None | str:
        """(time, line); None at end of output; "timeout" when the deadline passes first."""
        try:
            item = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return "timeout"
        if item is not None:
            self.tail = (self.tail + [item[1]])[-40:]
        return item

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def reap_group(self, grace_s: float = 20.0) -> None:
        """Wait for the child; then SIGTERM, and finally SIGKILL, whatever is left of its process group."""
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.popen.pid, sig)  # the group id is the child's pid (start_new_session)
            except ProcessLookupError:
                return
            time.sleep(1.0)


def sf_args(train_dir: str, seed: int, timeout_s: float, model: str) -> list[str]:
    """Sample Factory's CartPole APPO example (sf_examples/train_gym_env.py docstring) on CPU, 2 x 20 envs.

    ``model`` "matched": the encoder set to our MLP (two tanh layers of 32, separate actor and critic
    towers); "example": SF's defaults as the example runs them (encoder 512, 512 with elu, shared).
    """
    args = [f"--env={GYM_ID}", "--algo=APPO", "--use_rnn=False", f"--num_workers={SF_WORKERS}",
            f"--num_envs_per_worker={SF_ENVS_PER_WORKER}", "--policy_workers_per_policy=2", "--recurrence=1",
            "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1", "--save_every_sec=10",
            "--experiment_summaries_interval=10", "--device=cpu"]
    if model == "matched":
        args += ["--nonlinearity=tanh", "--actor_critic_share_weights=False", "--encoder_mlp_layers",
                 *map(str, SF_MLP)]
    return args + [f"--seed={seed}", f"--train_for_seconds={int(timeout_s) + 60}", "--with_wandb=False",
                   f"--train_dir={train_dir}", "--experiment=peer_cartpole"]


SF_MODELS = {"matched": {"encoder_mlp_layers": SF_MLP, "nonlinearity": "tanh", "actor_critic_share_weights": False},
             "example": {"encoder_mlp_layers": [512, 512], "nonlinearity": "elu", "actor_critic_share_weights": True}}


def run_sf(trial: int, seed: int, timeout_s: float, versions: dict[str, str], model: str) -> dict:
    """One SF training run in a temporary train_dir; returns its record."""
    with tempfile.TemporaryDirectory(prefix="sluice-sf-") as tmp:
        args = sf_args(tmp, seed, timeout_s, model)
        cmd = [str(venv_python()), str(Path(__file__).resolve()), "--sf-driver", str(timeout_s), *args]
        log(f"trial {trial}: Sample Factory APPO on gymnasium {GYM_ID} (seed {seed}, {model} model)")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        env.pop("VIRTUAL_ENV", None)
        proc = Proc(cmd, cwd=Path(tmp), env=env)
        deadline = proc.started + timeout_s + 90  # the driver stops SF at timeout_s; this is the backstop
        solved_at = None
        result: dict | None = None
        solved: dict | None = None
        interrupted = False
        while True:
            item = proc.next_line(deadline)
            if item == "timeout":
                if interrupted:
                    break
                log("Sample Factory did not finish in time; interrupting it")
                proc.signal(signal.SIGINT)
                interrupted, deadline = True, time.monotonic() + 30
                continue
            if item is None:
                break
            at, line = item
            if line.startswith(SF_MARK):
                message = json.loads(line[len(SF_MARK):])
                if message["kind"] == "solved":
                    solved, solved_at = message, at
                    log(f"  SF solved: {line[len(SF_MARK):]}")
                elif message["kind"] == "result":
                    result = message
            elif "Fps is" in line or "Avg episode reward" in line:
                log("  SF: " + line.split("] ", 1)[-1][:160])
        proc.reap_group()
        load = os.getloadavg()
        if result is None:
            log("Sample Factory output tail:\n" + "\n".join(proc.tail))
        samples = (result or {}).get("samples") or []
        return {
            "benchmark": "peer_sample_factory", "system": "sample_factory", "sf_model": model, "trial": trial,
            "seed": seed,
            "env": f"gymnasium {GYM_ID} (gymnasium {versions.get('gymnasium')}, in SF's venv)",
            "solved": solved is not None,
            "seconds_to_475": round(solved_at - proc.started, 2) if solved_at else None,
            "train_clock_s_to_475": round(solved["train_clock_s"], 2) if solved else None,
            "env_steps_to_475": solved["env_steps"] if solved else None,
            "final_mean_return": solved["mean_return"] if solved else (result or {}).get("last_mean_return"),
            **throughput(samples, solved_at - proc.started if solved_at else None),
            "sf_reported_fps": round(result["sf_fps"], 1) if result and result.get("sf_fps") else None,
            "exit_code": proc.popen.returncode, "loadavg_1m_at_end": round(load[0], 2),
            "settings": {"sample_factory": versions.get("sample-factory"), "torch": versions.get("torch"),
                         "algo": "APPO", "num_workers": SF_WORKERS, "num_envs_per_worker": SF_ENVS_PER_WORKER,
                         "policy_workers_per_policy": 2, "batch_size": 512, "device": "cpu",
                         **SF_MODELS[model], "normalize_input": True,
                         "args": " ".join(a for a in args if not a.startswith("--train_dir"))},
        }


def throughput(samples: list, seconds_to_475: float | None) -> dict:
    """env_steps_per_s between the first and the last (time, env_steps) sample; overall rate to 475."""
    rate = None
    if len(samples) >= 2 and samples[-1][0] > samples[0][0]:
        rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
    overall = samples[-1][1] / seconds_to_475 if samples and seconds_to_475 else None
    return {"env_steps_per_s": round(rate, 1) if rate else None,
            "env_steps_per_s_overall": round(overall, 1) if overall else None,
            "throughput_window": {"from_env_steps": samples[0][1], "to_env_steps": samples[-1][1],
                                  "seconds": round(samples[-1][0] - samples[0][0], 2)} if samples else None}


def run_ours(trial: int, seed: int, timeout_s: float, port: int, env_name: str) -> dict:
    """One Sluice run: learner + one actor host with OUR_WORKERS workers, as in cartpole_to_475.py."""
    overrides = [f"network.port={port}", f"run.seed={seed}"]
    if env_name == "gymnasium":
        overrides += ["env.name=gymnasium", f"env.gym_id={GYM_ID}"]
    with tempfile.TemporaryDirectory(prefix="sluice-peer-") as tmp:
        run_dir = Path(tmp) / "run"
        learner_cmd = [sys.executable, "-m", "learner", "--config", "configs/cartpole.yaml", "--run-dir",
                       str(run_dir)]
        for item in overrides:
            learner_cmd += ["--set", item]
        actors_cmd = [sys.executable, "-m", "actors", "--n", str(OUR_WORKERS), "--learner", f"tcp://127.0.0.1:{port}"]
        log(f"trial {trial}: Sluice on {env_name} (seed {seed}): {' '.join(learner_cmd[1:])}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        learner = Proc(learner_cmd, cwd=REPO, env=env)
        actors = Proc(actors_cmd, cwd=REPO, env=env, capture=False)
        deadline = learner.started + timeout_s
        match = None
        solved_at = None
        while True:
            item = learner.next_line(deadline)
            if item == "timeout":
                log(f"Sluice did not reach {TARGET:g} in {timeout_s:g} s; stopping it")
                learner.signal(signal.SIGTERM)
                break
            if item is None:
                break
            at, line = item
            found = OUR_SOLVED.search(line)
            if found and match is None:
                match, solved_at = found, at
                log("  " + line)
        learner.reap_group(grace_s=60)
        actors.reap_group(grace_s=30)
        load = os.getloadavg()
        records = []
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists():
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        if not records:
            log("Sluice learner output tail:\n" + "\n".join(learner.tail))
        samples = [(r["elapsed_s"], r["env_steps"]) for r in records]
        last = records[-1] if records else {}
        env_desc = (f"gymnasium {GYM_ID} (gymnasium {gym_version()}, Sluice's 'gymnasium' adapter)"
                    if env_name == "gymnasium" else "built-in numba CartPole-v1 port (env.name: cartpole)")
        wall = round(solved_at - learner.started, 2) if solved_at else None
        return {
            "benchmark": "peer_sample_factory", "system": "sluice", "trial": trial, "seed": seed,
            "env": env_desc, "solved": match is not None,
            "seconds_to_475": wall,
            "train_clock_s_to_475": float(match.group(3)) if match else None,
            "env_steps_to_475": last.get("env_steps") if match else None,
            "agent_steps_to_475": int(match.group(2).replace(",", "")) if match else None,
            "updates": int(match.group(4)) if match else last.get("update"),
            "final_mean_return": float(match.group(1)) if match else last.get("episode_return_mean"),
            **throughput(samples, wall),
            "exit_code": learner.popen.returncode, "loadavg_1m_at_end": round(load[0], 2),
            "settings": {"config": "configs/cartpole.yaml", "overrides": overrides[1:] if env_name == "gymnasium"
                         else [f"run.seed={seed}"], "actor_hosts": 1, "workers": OUR_WORKERS,
                         "envs_per_worker": plan_envs_per_worker(), "model": "MLP, 2 tanh layers of 32, "
                         "separate critic torso (policies/mlp.py)", "device": "cpu"},
        }


_GYM_VERSION: str | None = None


def gym_version() -> str:
    global _GYM_VERSION
    if _GYM_VERSION is None:
        from importlib.metadata import version

        _GYM_VERSION = version("gymnasium")
    return _GYM_VERSION


def plan_envs_per_worker() -> int | None:
    """envs_per_worker from the learner's batch plan for configs/cartpole.yaml with OUR_WORKERS workers."""
    out = subprocess.run([sys.executable, "-m", "learner", "--config", "configs/cartpole.yaml", "--plan", "--json"],
                         cwd=REPO, capture_output=True, text=True)
    try:
        return int(json.loads(out.stdout)["envs_per_worker"])
    except (ValueError, KeyError):
        return None


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sf-driver":
        raise SystemExit(sf_driver(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per training run")
    parser.add_argument("--port", type=int, default=5755, help="our learner's first port (it binds 3)")
    parser.add_argument("--sf-models", default="matched,example",
                        help="SF encoders to run, comma-separated: matched (our MLP), example (SF's default)")
    parser.add_argument("--skip-sf", action="store_true", help="run only our side")
    parser.add_argument("--skip-ours", action="store_true", help="run only Sample Factory")
    args = parser.parse_args()
    sf_models = [] if args.skip_sf else [m for m in args.sf_models.split(",") if m]
    unknown = set(sf_models) - set(SF_MODELS)
    if unknown:
        parser.error(f"unknown --sf-models {sorted(unknown)}; allowed: {sorted(SF_MODELS)}")
    from ops.benchlib import emit  # here, not at the top: the --sf-driver run in SF's venv has no ``ops`` to import

    versions = ensure_peer_venv() if sf_models else {}
    rows: dict[str, list[dict]] = {f"sf_{m}": [] for m in SF_MODELS}
    rows.update({"ours_gymnasium": [], "ours_numba": []})
    for trial in range(1, args.trials + 1):
        seed = trial
        for model in sf_models:
            rows[f"sf_{model}"].append(run_sf(trial, seed, args.timeout_s, versions, model))
            emit(rows[f"sf_{model}"][-1])
        if not args.skip_ours:
            for key, env_name in (("ours_gymnasium", "gymnasium"), ("ours_numba", "cartpole")):
                rows[key].append(run_ours(trial, seed, args.timeout_s, args.port, env_name))
                emit(rows[key][-1])

    def med(key: str, field: str) -> float | None:
        return median([r[field] for r in rows[key]])

    def ratio(ours: str, peer: str) -> float | None:
        a, b = med(ours, "env_steps_per_s"), med(peer, "env_steps_per_s")
        return round(a / b, 3) if a and b else None

    main_ratio = ratio("ours_gymnasium", "sf_matched")
    names = {"sf_matched": "sample_factory_gymnasium_matched_mlp",
             "sf_example": "sample_factory_gymnasium_example_model",
             "ours_gymnasium": "sluice_gymnasium", "ours_numba": "sluice_numba"}
    emit({"benchmark": "peer_sample_factory_summary", "trials": args.trials, "timeout_s": args.timeout_s,
          "target_ratio_env_steps_per_s": 1.5,
          "ratio_env_steps_per_s": main_ratio,
          "ratio_env_steps_per_s_env": "Sluice on gymnasium CartPole-v1 / Sample Factory on gymnasium "
                                       "CartPole-v1, both with the 2x32 tanh MLP",
          "meets_target": main_ratio >= 1.5 if main_ratio is not None else None,
          "ratio_env_steps_per_s_numba": ratio("ours_numba", "sf_matched"),
          "ratio_env_steps_per_s_numba_env": "Sluice on its built-in numba CartPole port / Sample Factory on "
                                             "gymnasium CartPole-v1 (different env code, same dynamics)",
          "ratio_env_steps_per_s_vs_sf_example_model": ratio("ours_gymnasium", "sf_example"),
          "env_steps_per_s": {names[k]: med(k, "env_steps_per_s") for k in names},
          "seconds_to_475": {names[k]: med(k, "seconds_to_475") for k in names},
          "solved": {names[k]: f"{sum(r['solved'] for r in rows[k])}/{len(rows[k])}" for k in names},
          "statistic": "median over trials (seconds_to_475: over solved trials only, null if none solved)"})


if __name__ == "__main__":
    main()
