"""The learner's evaluation child process: ``python -m evaluation.during_training`` (started by module name, so
the learner never imports ``evaluation``).

The child gets the run directory and ``evaluation``'s values as options; its output goes to
``<run-dir>/evaluation.log``. It stops on SIGTERM (``stop``: SIGTERM, then SIGKILL after ``timeout_s``) and by
itself when the learner is gone. ``check`` logs one warning, with the exit code, if it ended while the learner
trains on; training is never stopped for it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from configs.schema import EvaluationSection

LOG = logging.getLogger("sluice.learner")
MODULE = "evaluation.during_training"
LOG_NAME = "evaluation.log"
REPO_ROOT = Path(__file__).resolve().parents[1]
"""Put on the child's PYTHONPATH, so its module is found whatever the working directory."""


def evaluator_command(run_dir: Path, section: EvaluationSection) -> list[str]:
    """The child's command line."""
    return [sys.executable, "-m", MODULE, "--run-dir", str(run_dir.resolve()),
            "--interval-updates", str(section.interval_updates), "--games", str(section.games),
            "--baselines", ",".join(section.baselines), "--greedy" if section.greedy else "--no-greedy",
            "--gate-games", str(section.gate_games),
            "--parent-pid", str(os.getpid())]


class EvaluatorProcess:
    """Starts, watches and stops the evaluation child process of one run."""

    def __init__(self, run_dir: Path, section: EvaluationSection) -> None:
        self.run_dir = run_dir
        self.section = section
        self.process: subprocess.Popen | None = None
        self.log_file: IO[bytes] | None = None
        self.reported = False
        """Whether the child's end was logged already."""

    def start(self) -> None:
        """Start the child, its output appended to <run-dir>/evaluation.log."""
        self.log_file = (self.run_dir / LOG_NAME).open("ab")
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(evaluator_command(self.run_dir, self.section), stdin=subprocess.DEVNULL,
                                        stdout=self.log_file, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONPATH": path})
        LOG.info("evaluation during training: pid %d, every %d updates, %d games against %s; results in %s",
                 self.process.pid, self.section.interval_updates, self.section.games,
                 ", ".join(self.section.baselines), self.run_dir / "evaluation.jsonl")

    def check(self) -> None:
        """Log one warning (with the exit code) if the child has ended."""
        if self.process is None or self.reported:
            return
        code = self.process.poll()
        if code is not None:
            self.reported = True
            LOG.warning("evaluation during training stopped with exit code %d (see %s); training goes on", code,
                        self.run_dir / LOG_NAME)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the child and wait for it (SIGKILL after ``timeout_s``); safe to call more than once."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
