"""An actor host's COMA step (actors/team_stepper.py) on the built-in simple_spread: one team row per env holding
every agent's observation, pre-tanh draw, log-probability and reward, the env's global state, and at each episode end
(a truncation at max_steps) the final observations and state; the env receives the squash of the draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.assembler import RowAssembler
from actors.rows_report import RowsReport
from actors.slot_layout import SlotLayout
from actors.team_inference import TeamInference
from actors.team_stepper import TeamStepper
from configs.schema import ComaSection
from envs.base import StepBuffers
from envs.rows import row_layout
from envs.builtin.simple_spread import SimpleSpreadVec
from policies import tanh_gaussian

ENVS, AGENTS, MAX_STEPS, HORIZON = 4, 3, 5, 4


def make_stepper(env: SimpleSpreadVec) -> tuple[TeamStepper, StepBuffers, RowAssembler]:
    layout = SlotLayout(workers=1, groups=1, envs_per_group=ENVS, agents_per_env=AGENTS)
    buffers = StepBuffers.allocate(env.spec, ENVS)
    inference = TeamInference(env.spec, ComaSection(hidden_sizes=[16]), seed=0)
    assembler = RowAssembler.for_layout(row_layout(env.spec, horizon=HORIZON, state_size=0, team=True),
                                        num_agents=ENVS, num_rows=4 * ENVS)
    return TeamStepper(env_spec=env.spec, layout=layout, inference=inference, assembler=assembler), buffers, assembler


def test_team_rows_hold_each_env_whole_with_its_final_step() -> None:
    env = SimpleSpreadVec(ENVS, num_agents=AGENTS, max_steps=MAX_STEPS)
    stepper, buffers, assembler = make_stepper(env)
    view = stepper.layout.group_view(0, 0, buffers)
    env.reset(buffers, seed=3)
    seen, rows = [], []
    report = RowsReport.for_stats(env.spec.episode_stats)
    for _ in range(3 * (HORIZON - 1) + 1):
        before = {name: getattr(buffers, name).copy() for name in ("obs", "rewards", "truncated", "global_state",
                                                                    "final_obs", "final_global_state")}
        stepper.act([view], report)
        before["env_actions"] = buffers.actions.copy()
        seen.append(before)
        rows.extend(assembler.pop_full(100).tolist())
        env.step(buffers)
    gathered = assembler.gather(np.array(rows))
    assert len(rows) == 3 * ENVS and report.env_steps == len(seen) * ENVS
    assert report.agent_steps == len(seen) * ENVS * AGENTS
    for k in range(len(rows)):
        e = _env_of(gathered, k, seen)
        first = (k // ENVS) * (HORIZON - 1)
        for t in range(HORIZON):
            step = seen[first + t]
            slots = slice(e * AGENTS, (e + 1) * AGENTS)
            np.testing.assert_array_equal(gathered["obs"][k, t], step["obs"][slots])
            np.testing.assert_array_equal(gathered["rewards"][k, t], step["rewards"][slots])
            np.testing.assert_array_equal(gathered["global_state"][k, t], step["global_state"][e * AGENTS])
            ended = bool(step["truncated"][slots].any())
            assert gathered["dones"][k, t] == ended and gathered["truncated"][k, t] == ended
            if ended:
                np.testing.assert_array_equal(gathered["final_obs"][k, t], step["final_obs"][slots])
                np.testing.assert_array_equal(gathered["final_global_state"][k, t],
                                              step["final_global_state"][e * AGENTS])
            else:
                assert not gathered["final_obs"][k, t].any() and not gathered["final_global_state"][k, t].any()
            squashed = tanh_gaussian.squash(torch.from_numpy(gathered["actions"][k, t]),
                                            torch.tensor(env.spec.action.low, dtype=torch.float32),
                                            torch.tensor(env.spec.action.high, dtype=torch.float32))
            np.testing.assert_allclose(squashed.numpy(), step["env_actions"][slots], rtol=1e-6)
    assert gathered["dones"].any(), "an episode of max_steps must have ended within the rows"


def _env_of(gathered: dict[str, np.ndarray], k: int, seen: list[dict[str, np.ndarray]]) -> int:
    """The env whose observations row k's first step holds."""
    first = seen[(k // ENVS) * (HORIZON - 1)]["obs"].reshape(ENVS, AGENTS, -1)
    matches = [e for e in range(ENVS) if np.array_equal(first[e], gathered["obs"][k, 0])]
    assert len(matches) == 1
    return matches[0]


def test_an_inactive_agent_stops_the_host_with_a_reason() -> None:
    env = SimpleSpreadVec(ENVS, num_agents=AGENTS, max_steps=MAX_STEPS)
    stepper, buffers, _ = make_stepper(env)
    env.reset(buffers, seed=0)
    buffers.active[1] = False
    with pytest.raises(RuntimeError, match="coma needs every agent of an env to act on every step; 1 of 12"):
        stepper.act([stepper.layout.group_view(0, 0, buffers)], RowsReport.for_stats(env.spec.episode_stats))


def test_groups_of_different_workers_in_one_batch_are_read_and_written_by_their_slots() -> None:
    """Two of four groups (worker 0's second, worker 1's first) in one call: each env's row opens with that env's
    agents' observations and global state, only those slots get actions, the other groups' envs record nothing."""
    spec = SimpleSpreadVec(1, num_agents=AGENTS, max_steps=MAX_STEPS).spec
    layout = SlotLayout(workers=2, groups=2, envs_per_group=ENVS, agents_per_env=AGENTS)
    slots = StepBuffers.allocate(spec, layout.total_envs)
    rng = np.random.default_rng(5)
    slots.obs[:] = rng.standard_normal(slots.obs.shape)
    slots.global_state[:] = rng.standard_normal(slots.global_state.shape)
    slots.active[:] = True
    assembler = RowAssembler.for_layout(row_layout(spec, horizon=HORIZON, state_size=0, team=True),
                                        num_agents=layout.total_envs, num_rows=4 * layout.total_envs)
    stepper = TeamStepper(env_spec=spec, layout=layout, assembler=assembler,
                          inference=TeamInference(spec, ComaSection(hidden_sizes=[16]), seed=0))
    groups = [layout.group_view(0, 1, slots), layout.group_view(1, 0, slots)]
    stepper.act(groups, RowsReport.for_stats(spec.episode_stats))
    acted = np.concatenate([view.slot_ids for view in groups])
    envs = np.unique(acted // AGENTS)
    assert envs.tolist() == list(range(ENVS, 3 * ENVS))  # worker 0's group 1 and worker 1's group 0
    assert assembler.ep_lengths[envs].tolist() == [1] * len(envs)
    assert not assembler.ep_lengths[np.setdiff1d(np.arange(layout.total_envs), envs)].any()
    for e in envs:
        row = assembler.ep_indices[e]
        np.testing.assert_array_equal(assembler.arrays["obs"][row, 0], slots.obs[e * AGENTS:(e + 1) * AGENTS])
        np.testing.assert_array_equal(assembler.arrays["global_state"][row, 0], slots.global_state[e * AGENTS])
    others = np.setdiff1d(np.arange(layout.total_slots), acted)
    assert np.abs(slots.actions[acted]).sum(axis=-1).all() and not slots.actions[others].any()
