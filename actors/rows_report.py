"""What an actor host reports with its next ROWS message besides the rows: step counts, env restarts, the
episodes that ended and the timing of its inference step and workers. Cleared after every message."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from protocol.rows import HOST_STATS, STEP_COUNTS


@dataclass(kw_only=True)
class RowsReport:
    """Per-host counters shipped with the next ROWS message."""

    env_steps: int = 0
    """Env steps taken (one env, all its agents, one step)."""
    agent_steps: int = 0
    """Steps of active agents (what the learner's total_timesteps counts)."""
    env_restarts: int = 0
    """Env groups that raised and were rebuilt."""
    returns: list[float] = field(default_factory=list)
    """Returns of the episodes that ended."""
    lengths: list[int] = field(default_factory=list)
    """Their lengths."""
    stats: dict[str, list[float]] = field(default_factory=dict)
    """The env's named episode statistics of those episodes, by name."""
    inference_batches: int = 0
    """Forward passes (one per ``GroupStepper.act``)."""
    inference_agents: int = 0
    """Agents decided for in those passes (the batch size the inference step reached, summed)."""
    inference_s: float = 0.0
    """Seconds spent in the policy (sampling included) in those passes."""
    act_s: float = 0.0
    """Seconds spent in ``GroupStepper.act`` in total (gathering, policy, recording in the assembler)."""
    worker_wait_s: float = 0.0
    """Seconds env workers spent waiting for actions (all workers summed; filled in by the host)."""
    worker_step_s: float = 0.0
    """Seconds env workers spent stepping their envs (all workers summed; filled in by the host)."""

    @classmethod
    def for_stats(cls, episode_stats: tuple[str, ...]) -> "RowsReport":
        """An empty report that lists every one of the env's named episode statistics (even with no values)."""
        return cls(stats={name: [] for name in episode_stats})

    def clear(self) -> None:
        """After shipping: start counting afresh."""
        for name in STEP_COUNTS:
            setattr(self, name, 0)
        self.returns, self.lengths = [], []
        self.stats = {name: [] for name in self.stats}
        self.inference_batches = self.inference_agents = 0
        self.inference_s = self.act_s = self.worker_wait_s = self.worker_step_s = 0.0

    def take(self) -> "RowsReport":
        """What was counted so far, as a report of its own; this one starts counting afresh."""
        taken = replace(self)  # clear() rebinds the lists and dicts, so ``taken`` keeps its own
        self.clear()
        return taken

    def host_stats(self) -> dict[str, float]:
        """The timing counters as the ROWS message's ``host_stats`` field."""
        return {name: getattr(self, name) for name in HOST_STATS}

    def fields(self, num_rows: int) -> dict[str, Any]:
        """The ROWS message's fields for a block of ``num_rows`` rows."""
        return {"num_rows": num_rows, "episode_returns": self.returns, "episode_lengths": self.lengths,
                **{name: getattr(self, name) for name in STEP_COUNTS},
                "episode_stats": self.stats, "host_stats": self.host_stats()}
