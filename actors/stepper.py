"""One inference step of an actor host: ready env groups in shared memory -> actions back, steps recorded.

``GroupStepper.act`` reads what the workers of the ready groups wrote (observations, rewards, episode ends,
action masks, which slots are active), runs the policy once for all active agents, writes the actions into
the groups' shared memory and records the steps in the row assembler. Inactive slots (agents that finished
before the rest of their env, sub-envs between an episode end and their reset) are neither acted for nor
recorded: the learner never sees a padded step. The host only wakes the workers afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from actors.assembler import RowAssembler
from envs.base import EnvSpec
from actors.inference import Inference, NullInference
from actors.opponents import Opponents
from actors.recurrent_state import AgentStates
from protocol.rows import HOST_STATS


@dataclass
class Pending:
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

    def clear(self) -> None:
        """After shipping: start counting afresh."""
        self.env_steps = self.agent_steps = self.env_restarts = 0
        self.returns, self.lengths = [], []
        self.stats = {name: [] for name in self.stats}
        self.inference_batches = self.inference_agents = 0
        self.inference_s = self.act_s = self.worker_wait_s = self.worker_step_s = 0.0

    def host_stats(self) -> dict[str, float]:
        """The timing counters as the ROWS message's ``host_stats`` field."""
        return {name: getattr(self, name) for name in HOST_STATS}


class GroupStepper:
    """Inference and recording for groups of ``envs_per_group`` envs; agent id = global slot index."""

    def __init__(self, *, spec: EnvSpec, inference: Inference | NullInference, assembler: RowAssembler, states: AgentStates,
                 envs_per_group: int, groups_per_worker: int, opponents: Opponents | None = None) -> None:
        self.spec = spec
        self.opponents = opponents
        self.env_steps = 0
        """Env steps taken since the start (all groups)."""
        self.inference = inference
        self.assembler = assembler
        self.states = states
        self.envs_per_group = envs_per_group
        self.slots_per_group = envs_per_group * spec.num_agents
        self.slots_per_worker = self.slots_per_group * groups_per_worker

    def act(self, ready: list[tuple[dict[str, np.ndarray], int, int]], pending: Pending) -> None:
        """For each ready (worker views, worker index, group): decide, write actions, record the steps."""
        started = time.perf_counter()
        spg = self.slots_per_group
        parts = [(views, slice(g * spg, (g + 1) * spg), w * self.slots_per_worker + g * spg)
                 for views, w, g in ready]
        all_ids = np.concatenate([np.arange(start, start + spg, dtype=np.int64) for _, _, start in parts])
        learner = None if self.opponents is None else self.opponents.learner_slots[all_ids]
        self._episode_stats(parts, pending, learner)
        active = np.concatenate([v["active"][s] for v, s, _ in parts])
        theirs = None
        if learner is not None:  # opponent seats act through their snapshots and are never recorded
            theirs = np.flatnonzero(active & ~learner)
            active = active & learner
        chosen = None if active.all() else np.flatnonzero(active)

        joined: dict[str, np.ndarray] = {}

        def gather(name: str, where: np.ndarray | None = chosen) -> np.ndarray:
            if name not in joined:  # one concatenation per field, shared by the learner's and opponents' seats
                joined[name] = np.concatenate([v[name][s] for v, s, _ in parts])
            return joined[name] if where is None else joined[name][where]

        agent_ids = all_ids if chosen is None else all_ids[chosen]
        obs, rewards = gather("obs"), gather("rewards")
        terminated, truncated = gather("terminated"), gather("truncated")
        masks = gather("action_mask") if self.spec.mask_size else None
        bootstrap = np.zeros(len(obs), dtype=np.float32)
        if truncated.any():  # V(final obs) from the state the agent had before its episode ended
            final_obs = gather("final_obs")[truncated]
            bootstrap[truncated] = self.inference.values(final_obs, self.states.read(agent_ids[truncated]))
        self.states.reset(agent_ids[terminated | truncated])  # obs is the first of a new episode there
        state_in = self.states.read(agent_ids)
        decide_started = time.perf_counter()
        decisions = self.inference.decide(obs, state_in, masks)
        pending.inference_s += time.perf_counter() - decide_started
        pending.inference_batches += 1
        pending.inference_agents += len(agent_ids)
        self.states.write(agent_ids, decisions.states)
        actions = decisions.actions
        if chosen is not None:  # inactive slots get a zero action, which their env ignores
            actions = np.zeros((len(active), *self.spec.action.shape), dtype=self.spec.action.dtype)
            actions[chosen] = decisions.actions
        if theirs is not None and len(theirs):
            their_masks = gather("action_mask", theirs) if self.spec.mask_size else None
            actions[theirs] = self.opponents.act(all_ids[theirs], gather("obs", theirs), their_masks)
        for i, (v, s, _) in enumerate(parts):
            v["actions"][s] = actions[i * spg:(i + 1) * spg]
        pending.env_steps += len(parts) * self.envs_per_group
        self.env_steps += len(parts) * self.envs_per_group
        pending.agent_steps += len(agent_ids)
        if len(agent_ids):
            dones = (terminated | truncated).astype(np.uint8)
            self.assembler.add_steps(agent_ids, obs, decisions.actions, decisions.logprobs, decisions.values,
                                     rewards, dones, bootstrap, self.inference.version, states=state_in,
                                     action_masks=masks)
        pending.act_s += time.perf_counter() - started

    def forget_worker(self, worker: int) -> None:
        """A worker died and is being replaced: drop its agents' partial rows and zero their states."""
        start = worker * self.slots_per_worker
        agents = np.arange(start, start + self.slots_per_worker, dtype=np.int64)
        self.assembler.discard_agents(agents)
        self.states.reset(agents)  # the new worker's envs start fresh episodes

    def _episode_stats(self, parts: list, pending: Pending, learner: np.ndarray | None) -> None:
        """Collect the episodes that ended in these groups, whether or not their slots act now (in self-play:
        the learner's seats only; an env whose episode ended switches to its next opponent, if one waits)."""
        spg = self.slots_per_group
        for i, (v, s, start) in enumerate(parts):
            done = v["episode_done"][s]
            if learner is not None:
                if done.any():
                    self.opponents.episodes_ended(np.flatnonzero(done) + start)
                done = done & learner[i * spg:(i + 1) * spg]
            if done.any():
                pending.returns.extend(v["episode_return"][s][done].tolist())
                pending.lengths.extend(v["episode_length"][s][done].tolist())
                for k, name in enumerate(self.spec.episode_stats):
                    pending.stats.setdefault(name, []).extend(v["episode_stats"][s][done, k].tolist())
