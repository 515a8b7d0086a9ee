"""Team rows -> COMA's joint transitions (learner/coma/rows.py) against an independent NumPy reading of protocol.rows,
on random rows with episodes that end mid-row by termination and by truncation; and the ingest's counter check for
team rows (a row step records every agent of its env)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.base import EnvSpec
from envs.rows import row_layout
from envs.spaces import ActionSpace
from learner.update.batch import BatchBuffers, to_batch
from learner.coma.rows import transitions_from_rows
from learner.serve.row_checks import RowRules, max_agent_steps
from learner.serve.senders import Sender

AGENTS, OBS, ACTION, STATE = 3, 4, 2, 5
LOW, HIGH = np.array([-1.0, 0.0]), np.array([1.0, 2.0])
SPEC = EnvSpec(num_agents=AGENTS, obs_shape=(OBS,), obs_dtype="float32", action=ActionSpace.box(LOW, HIGH),
               state_size=STATE)


def random_rows(rng: np.random.Generator, rows: int, horizon: int) -> BatchBuffers:
    """Team rows with random values; episodes end at random steps, a random share of them by truncation."""
    buffers = BatchBuffers.allocate(row_layout(SPEC, horizon=horizon, state_size=0, team=True), rows)
    a = buffers.arrays
    for name in ("obs", "actions", "logprobs", "rewards", "global_state", "final_obs", "final_global_state"):
        a[name][:] = rng.normal(size=a[name].shape).astype(np.float32)
    a["dones"][:] = rng.random((rows, horizon)) < 0.3
    a["truncated"][:] = a["dones"] & (rng.random((rows, horizon)) < 0.5)
    a["values"][:], a["bootstrap"][:], a["versions"][:] = 0, 0, 0
    return buffers


def reference(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Transition by transition, as protocol.rows defines a step's fields."""
    out: dict[str, list] = {k: [] for k in ("state", "obs", "pre_tanh", "actions", "logprobs", "rewards", "next_state",
                                            "next_obs", "terminated")}
    rows, horizon = a["dones"].shape
    for r in range(rows):
        for t in range(horizon - 1):
            ended = bool(a["dones"][r, t + 1])
            u = a["actions"][r, t].astype(np.float64)
            out["state"].append(a["global_state"][r, t])
            out["obs"].append(a["obs"][r, t])
            out["pre_tanh"].append(u)
            out["actions"].append(LOW + (np.tanh(u) + 1) * (HIGH - LOW) / 2)
            out["logprobs"].append(a["logprobs"][r, t])
            out["rewards"].append(a["rewards"][r, t + 1])
            out["next_state"].append(a["final_global_state" if ended else "global_state"][r, t + 1])
            out["next_obs"].append(a["final_obs" if ended else "obs"][r, t + 1])
            out["terminated"].append(float(ended and not a["truncated"][r, t + 1]))
    return {k: np.array(v) for k, v in out.items()}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), horizon=st.integers(2, 7))
def test_transitions_match_the_row_semantics(seed: int, rows: int, horizon: int) -> None:
    buffers = random_rows(np.random.default_rng(seed), rows, horizon)
    got = transitions_from_rows(to_batch(buffers, torch.device("cpu")), torch.tensor(LOW, dtype=torch.float32),
                                torch.tensor(HIGH, dtype=torch.float32))
    expected = reference(buffers.arrays)
    assert set(got) == set(expected)
    for name, values in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == values.shape, name
        np.testing.assert_allclose(got[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_truncated_end_bootstraps_and_a_terminal_one_does_not() -> None:
    buffers = random_rows(np.random.default_rng(0), 1, 4)
    a = buffers.arrays
    a["dones"][0] = [0, 1, 1, 0]
    a["truncated"][0] = [0, 1, 0, 0]
    got = transitions_from_rows(to_batch(buffers, torch.device("cpu")), torch.tensor(LOW, dtype=torch.float32),
                                torch.tensor(HIGH, dtype=torch.float32))
    assert got["terminated"].tolist() == [0.0, 1.0, 0.0]
    np.testing.assert_array_equal(got["next_obs"][0], a["final_obs"][0, 1])  # truncated: its true last obs
    np.testing.assert_array_equal(got["next_state"][1], a["final_global_state"][0, 2])
    np.testing.assert_array_equal(got["next_obs"][2], a["obs"][0, 3])


def test_team_rows_count_every_agent_of_a_row_step() -> None:
    """A host of E envs x N agents writes E team rows; each step of one records N agent steps."""
    sender = Sender(name="h", token="t", curve_key=None, num_envs=8, agent_slots=8 * AGENTS)
    per_agent = RowRules(action=SPEC.action, mask_size=0, bptt_horizon=4, rows_per_message=4, max_abs_value=1e6)
    team = RowRules(action=SPEC.action, mask_size=0, bptt_horizon=4, rows_per_message=4, max_abs_value=1e6,
                    agents_per_row=AGENTS)
    assert max_agent_steps(2, sender, per_agent) == (2 + 2 * 24) * 4
    assert max_agent_steps(2, sender, team) == (2 + 2 * 8) * 4 * AGENTS
    assert max_agent_steps(4, sender, team) == (8 + 2 * 4 + 2 * 8) * 4 * AGENTS
