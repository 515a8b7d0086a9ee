"""One seed's training through the real pipeline, for the benchmarks that score a trained policy.

``trained_run`` starts ``python -m learner`` and one actor host (``python -m actors``: the run's
trainer.num_workers env workers; separate processes, ZeroMQ, shared memory) in a temporary run directory, lets them
train for a wall-clock window, stops the learner with SIGINT (it writes a final checkpoint and the actors then
leave), and yields the run directory while it still exists. Whatever happens (an error, Ctrl-C, SIGTERM), every
process it started, and their children, is gone when the ``with`` block ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ops.benchlib import sigterm_as_interrupt

REPO = Path(__file__).resolve().parents[2]
AGENT_STEPS = re.compile(r"([\d,]+)/[\d.,]+[KMGT]? ")
"""The learner's --plain progress line: ``<agent steps>/<total> ...``."""
UNLIMITED_TIMESTEPS = 1_000_000_000
"""trainer.total_timesteps unless the overrides set one: the wall-clock window, not the step budget, ends the run."""
STOP_GRACE_S = 120.0
"""How long the learner gets to write its final checkpoint after SIGINT (and the actors to leave)."""
KILL_GRACE_S = 10.0
"""How long a process group gets between SIGTERM and SIGKILL when it is cleaned up."""


@dataclass(frozen=True, kw_only=True)
class TrainedRun:
    """What one seed's pipeline training left behind."""

    run_dir: Path
    """The learner's run directory (metrics.jsonl, config.yaml, checkpoints/); gone after the ``with`` block."""
    learner_output: str
    """The learner's stdout and stderr."""
    learner_exit_code: int | None
    """The learner's exit status (None if it did not stop within the grace period)."""

    @property
    def agent_steps(self) -> int | None:
        """The agent steps the learner's last progress line reports (None without one)."""
        steps = AGENT_STEPS.findall(self.learner_output)
        return int(steps[-1].replace(",", "")) if steps else None


def start(args: Sequence[str], *, log: Path) -> subprocess.Popen:
    """``python args`` in the repo root, in its own process group, with stdout and stderr to ``log``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as handle:
        return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the process group ``process`` leads (nothing if the group is gone)."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def end_group(process: subprocess.Popen) -> None:
    """Make sure ``process`` and every process left in its group are gone: SIGTERM, then SIGKILL."""
    signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    signal_group(process, signal.SIGKILL)
    process.wait()


@contextmanager
def trained_run(*, config: str, seed: int, seconds: float, port: int,
                overrides: Sequence[str] = ()) -> Iterator[TrainedRun]:
    """Train ``config`` with ``run.seed=seed`` on ``port`` (and the next three) for ``seconds``; yield the run.
    ``overrides`` are more ``SECTION.KEY=VALUE`` settings for the learner's ``--set`` (applied last, so
    ``trainer.total_timesteps=N`` sets a step budget; the run then ends at whichever comes first)."""
    with sigterm_as_interrupt(), _temporary_run(config=config, seed=seed, seconds=seconds, port=port,
                                                overrides=overrides) as run:
        yield run


@contextmanager
def _temporary_run(*, config: str, seed: int, seconds: float, port: int,
                   overrides: Sequence[str]) -> Iterator[TrainedRun]:
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        run_dir = Path(tmp, "run")
        learner_log = Path(tmp, "learner.log")
        processes: list[subprocess.Popen] = []
        try:
            learner = start(["-m", "learner", "--config", config, "--run-dir", str(run_dir), "--plain",
                             "--set", f"network.port={port}", "--set", f"run.seed={seed}",
                             "--set", f"trainer.total_timesteps={UNLIMITED_TIMESTEPS}",
                             *(arg for override in overrides for arg in ("--set", override))],
                            log=learner_log)
            processes.append(learner)
            actor_host = start(["-m", "actors", "--learner", f"tcp://127.0.0.1:{port}"], log=Path(tmp, "actors.log"))
            processes.append(actor_host)
            try:
                learner.wait(timeout=seconds)  # a stop rule in ``overrides`` may end the run sooner
            except subprocess.TimeoutExpired:
                learner.send_signal(signal.SIGINT)
            try:
                learner.wait(timeout=STOP_GRACE_S)
                actor_host.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            yield TrainedRun(run_dir=run_dir, learner_output=learner_log.read_text(errors="replace"),
                             learner_exit_code=learner.poll())
        finally:
            for process in processes:
                end_group(process)
