"""When a run is done: the target return reached over the last 100 episodes, or total_timesteps trained."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from configs.schema import TrainerSection
from learner.run.checkpoint import TrainerState


@dataclass(frozen=True, kw_only=True)
class StopDecision:
    """The run is done."""

    reason: str
    """Why, as the learner's stop message and actor hosts' shutdown notice say it."""
    announcement: str
    """The console line (benchmarks parse "learner: solved: mean return ... after N agent steps in S s")."""


def check_stop_rules(trainer: TrainerSection, state: TrainerState) -> StopDecision | None:
    """Whether the run is done after the update ``state`` counts; None to go on."""
    returns = state.recent_returns
    target = trainer.target_episode_return
    if target is not None and len(returns) >= 100 and np.mean(returns) >= target:
        return StopDecision(
            reason="target return reached",
            announcement=(f"learner: solved: mean return {np.mean(returns):.1f} over the last 100 episodes "
                          f">= {target:g} after {state.agent_steps:,} agent steps in {state.elapsed_s:.1f} s "
                          f"({state.update} updates)"))
    if state.agent_steps >= trainer.total_timesteps:
        return StopDecision(
            reason="total_timesteps reached",
            announcement=(f"learner: reached total_timesteps ({state.agent_steps:,} agent steps) in "
                          f"{state.elapsed_s:.1f} s"))
    return None
