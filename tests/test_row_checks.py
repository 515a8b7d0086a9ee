"""Property tests of the ingest's message checks: for random small env layouts, genuine ROWS messages are
accepted, and each kind of wrong content (an action out of range or forbidden by its mask, a flag of 2, a NaN
or absurd float, a negative or impossible counter, a bad episode, a negative version, a foreign token) is
refused under its own reason and counted once, with nothing of it counted as steps or episodes."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import zmq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from envs.base import EnvSpec, ObsLeaf
from envs.obs_layout import structured_obs
from envs.spaces import ActionSpace
from envs.rows import row_layout
from learner.update.batch import BatchBuffers, to_batch
from learner.serve.ingest import Ingest
from learner.serve.row_checks import (LOG_FLOAT32_TINY, MAX_EPISODE_LENGTH, RowRules, check_rows, logprob_bounds,
                                max_agent_steps, max_env_steps, read_report)
from learner.serve.senders import Sender, SenderRegistry
from protocol import Limits, Message, MessageType, ProtocolError, encode
from protocol.validation import out_of_range_index

POLICY_VERSION, MAX_LAG, MAX_ABS = 7, 3, 1e6
TOKEN = "f" * 32
ENDPOINTS = itertools.count()
DISCRETE = ("discrete", "multi_discrete")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One random layout: the env, the run's row settings and the registered host."""

    spec: EnvSpec
    """The env."""
    horizon: int
    """Steps per row."""
    state_size: int
    """Recurrent state width."""
    rows_per_message: int
    """network.rows_per_message."""
    sender: Sender
    """The registered host the messages come from."""


@st.composite
def cases(draw) -> Case:
    kind = draw(st.sampled_from(["discrete", "multi_discrete", "box"]))
    if kind == "discrete":
        action = ActionSpace.discrete(draw(st.integers(1, 5)))
    elif kind == "multi_discrete":
        action = ActionSpace.multi_discrete(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    else:
        dims = draw(st.integers(1, 3))
        action = ActionSpace.box([-1.0] * dims, [1.0] * dims)
    spec = EnvSpec(num_agents=draw(st.integers(1, 3)), obs_shape=draw(st.sampled_from([(1,), (3,), (2, 2)])),
                   obs_dtype=draw(st.sampled_from(["float32", "uint8"])), action=action,
                   action_mask=kind != "box" and draw(st.booleans()),
                   episode_stats=draw(st.sampled_from([(), ("goals",)])))
    if draw(st.booleans()):  # a structured observation: the same flat obs, its leaves in the spec
        dtype = draw(st.sampled_from(["uint8", "float32"]))
        leaves = [ObsLeaf(path=("grid",), kind="box", shape=(2, 2), dtype="uint8"),
                  ObsLeaf(path=("pos", 0), kind="discrete", nvec=(4,)),
                  *([ObsLeaf(path=("pos", 1), kind="box", shape=(1,), dtype="float32")] if dtype == "float32" else [])]
        spec = dataclasses.replace(spec, **structured_obs(leaves))
    num_envs = draw(st.integers(1, 4))
    return Case(spec=spec, horizon=draw(st.integers(2, 5)), state_size=draw(st.sampled_from([0, 2])),
                rows_per_message=draw(st.integers(1, 4)),
                sender=Sender(name="prop", token=TOKEN, curve_key=None, num_envs=num_envs,
                              agent_slots=num_envs * spec.num_agents))


def genuine(case: Case, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and fields of a ROWS message a real host of this layout could send."""
    spec, action = case.spec, case.spec.action
    layout = row_layout(spec, horizon=case.horizon, state_size=case.state_size)
    n = int(rng.integers(1, case.rows_per_message + 1))
    arrays = layout.allocate(n)
    obs = arrays["obs"]
    obs[:] = rng.normal(0, 10, obs.shape) if obs.dtype.kind == "f" else rng.integers(0, 256, obs.shape)
    if action.kind == "box":
        arrays["actions"][:] = rng.normal(0, 1, arrays["actions"].shape)
    else:
        masks = arrays["action_masks"]
        masks[:] = rng.random(masks.shape) < 0.6
        picks = arrays["actions"].reshape(n, case.horizon, len(action.nvec))
        offset = 0
        for i, choices in enumerate(action.nvec):
            block = masks[..., offset:offset + choices] if spec.action_mask else np.ones((n, case.horizon, choices))
            weights = np.where(block.any(-1, keepdims=True), block, 1) * rng.random(block.shape)
            picks[..., i] = weights.argmax(-1)  # a legal choice; any choice where nothing is legal
            offset += choices
    arrays["logprobs"][:] = -5 * rng.random((n, case.horizon))
    for name in ("values", "rewards", "bootstrap"):
        arrays[name][:] = rng.normal(0, 100, (n, case.horizon))
    arrays["dones"][:] = rng.random((n, case.horizon)) < 0.2
    arrays["versions"][:] = rng.integers(POLICY_VERSION - MAX_LAG, POLICY_VERSION + 1, n)
    arrays["states"][:] = rng.normal(0, 1, arrays["states"].shape)
    agents_per_env = spec.num_agents
    agent_steps = int(rng.integers(0, n * (case.horizon - 1) + 1))
    env_steps = min(-(-agent_steps // agents_per_env) + int(rng.integers(0, n + 1)),  # within the sanity cap
                    max_env_steps(n, case.sender, rules_of(case)))
    episodes = int(rng.integers(0, min(env_steps * agents_per_env, agent_steps + case.sender.agent_slots, 4) + 1))
    lengths = [int(x) for x in rng.integers(1, 500, episodes)]
    fields = {"num_rows": n, "env_steps": env_steps, "agent_steps": agent_steps,
              "env_restarts": int(rng.integers(0, 2)), "token": TOKEN,
              "episode_returns": [float(rng.uniform(-10, 10) * length) for length in lengths],
              "episode_lengths": lengths,
              "episode_stats": {name: [float(v) for v in rng.random(episodes)] for name in spec.episode_stats},
              "host_stats": {"inference_batches": 1, "inference_agents": agent_steps, "inference_s": 0.001}}
    return arrays, fields


def _one(array: np.ndarray, rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(int(rng.integers(0, d)) for d in array.shape)


def out_of_range_action(case, arrays, fields, rng):
    assume(case.spec.action.kind != "box")
    actions = arrays["actions"]
    index = _one(actions, rng)
    component = index[2] if actions.ndim == 3 else 0
    actions[index] = rng.choice([case.spec.action.nvec[component], -1, np.iinfo(np.int32).max])


def forbidden_action(case, arrays, fields, rng):
    assume(case.spec.action_mask and case.spec.action.nvec[0] >= 2)
    row, step = _one(arrays["dones"], rng)
    choice = int(arrays["actions"][row, step] if arrays["actions"].ndim == 2 else arrays["actions"][row, step, 0])
    arrays["action_masks"][row, step, :case.spec.action.nvec[0]] = 1  # component 0: all legal but the one taken
    arrays["action_masks"][row, step, choice] = 0


def flag_of_two(name):
    def mutate(case, arrays, fields, rng):
        assume(arrays[name].size)
        arrays[name][_one(arrays[name], rng)] = 2
    return mutate


def float_value(name, value):
    def mutate(case, arrays, fields, rng):
        assume(arrays[name].dtype.kind == "f" and arrays[name].size)
        arrays[name][_one(arrays[name], rng)] = value
    return mutate


def field_value(name, value):
    def mutate(case, arrays, fields, rng):
        fields[name] = value(case, fields) if callable(value) else value
    return mutate


def negative_version(case, arrays, fields, rng):
    arrays["versions"][int(rng.integers(0, len(arrays["versions"])))] = -1


def more_episodes_than_steps(case, arrays, fields, rng):
    count = fields["env_steps"] * case.spec.num_agents + 1
    fields["episode_returns"], fields["episode_lengths"] = [1.0] * count, [1] * count
    fields["episode_stats"] = {name: [0.0] * count for name in case.spec.episode_stats}


def episodes_without_steps(case, arrays, fields, rng):
    """The message of issue 28: many episodes, no agent step counted (env steps enough for the older rule)."""
    count = case.sender.agent_slots + 1
    fields["agent_steps"], fields["env_steps"] = 0, count
    fields["episode_returns"], fields["episode_lengths"] = [500.0] * count, [500] * count
    fields["episode_stats"] = {name: [0.0] * count for name in case.spec.episode_stats}


def logprob(value, kinds):
    def mutate(case, arrays, fields, rng):
        assume(case.spec.action.kind in kinds)
        arrays["logprobs"][_one(arrays["logprobs"], rng)] = value(case) if callable(value) else value
    return mutate


def first_episode(name, value):
    def mutate(case, arrays, fields, rng):
        assume(fields["episode_lengths"])
        fields[name][0] = value
    return mutate


def without_token(case, arrays, fields, rng):
    del fields["token"]


MUTATIONS: dict[str, tuple[Callable, str]] = {
    "action_out_of_range": (out_of_range_action, "bad_action"),
    "action_forbidden_by_mask": (forbidden_action, "bad_action"),
    "dones_2": (flag_of_two("dones"), "bad_flag"),
    "mask_2": (flag_of_two("action_masks"), "bad_flag"),
    "value_nan": (float_value("values", np.nan), "non_finite"),
    "reward_inf": (float_value("rewards", np.inf), "non_finite"),
    "obs_nan": (float_value("obs", np.nan), "non_finite"),
    "state_nan": (float_value("states", np.nan), "non_finite"),
    "box_action_nan": (float_value("actions", np.nan), "non_finite"),
    "obs_1e30": (float_value("obs", 1e30), "absurd_value"),
    "value_1e30": (float_value("values", 1e30), "absurd_value"),
    "bootstrap_minus_1e30": (float_value("bootstrap", -1e30), "absurd_value"),
    "logprob_minus_1e30": (float_value("logprobs", -1e30), "absurd_value"),
    "state_1e30": (float_value("states", 1e30), "absurd_value"),
    "box_action_1e30": (float_value("actions", 1e30), "absurd_value"),
    "logprob_minus_1e6_discrete": (logprob(-1e6, DISCRETE), "bad_logprob"),
    "logprob_below_the_floor": (logprob(lambda case: len(case.spec.action.nvec) * LOG_FLOAT32_TINY - 0.01,
                                        DISCRETE), "bad_logprob"),
    "logprob_positive_discrete": (logprob(0.5, DISCRETE), "bad_logprob"),
    "box_logprob_above_any_density": (logprob(lambda case: logprob_bounds(rules_of(case))[1] + 1.0, ("box",)),
                                      "bad_logprob"),
    "episodes_without_steps": (episodes_without_steps, "bad_counter"),
    "negative_version": (negative_version, "bad_row_version"),
    "negative_agent_steps": (field_value("agent_steps", -1), "bad_counter"),
    "negative_env_steps": (field_value("env_steps", -5), "bad_counter"),
    "negative_env_restarts": (field_value("env_restarts", -1), "bad_counter"),
    "huge_agent_steps": (field_value("agent_steps", 2 ** 63 - 1), "bad_counter"),
    "huge_env_steps": (field_value("env_steps", 2 ** 63 - 1), "bad_counter"),
    "agent_steps_over_bound": (field_value("agent_steps", lambda case, fields: 1 + max_agent_steps(
        fields["num_rows"], case.sender, rules_of(case))), "bad_counter"),
    "agent_steps_over_env_steps": (field_value("agent_steps", lambda case, fields: (
        fields["env_steps"] * case.spec.num_agents + 1)), "bad_counter"),
    "more_episodes_than_steps": (more_episodes_than_steps, "bad_counter"),
    "episode_length_0": (first_episode("episode_lengths", 0), "bad_episode"),
    "episode_length_huge": (first_episode("episode_lengths", MAX_EPISODE_LENGTH + 1), "bad_episode"),
    "episode_return_nan": (first_episode("episode_returns", float("nan")), "bad_episode"),
    "episode_return_absurd": (first_episode("episode_returns", 2e6 * 500), "bad_episode"),
    "unknown_token": (field_value("token", "0" * 32), "not_registered"),
    "no_token": (without_token, "not_registered"),
    "too_many_rows": (field_value("num_rows", lambda case, fields: case.rows_per_message + 1), "too_large"),
}


def rules_of(case: Case) -> RowRules:
    return RowRules(action=case.spec.action, mask_size=case.spec.mask_size, bptt_horizon=case.horizon - 1,
                    rows_per_message=case.rows_per_message, max_abs_value=MAX_ABS)


@pytest.fixture(scope="module")
def context():
    context = zmq.Context()
    yield context
    context.term()


def offer(context: zmq.Context, case: Case, arrays: dict[str, np.ndarray], fields: dict):
    """Hand one message to an unstarted ingest of this layout; return what it kept and its snapshot after."""
    registry = SenderRegistry()
    registry.add(case.sender)
    ingest = Ingest(context=context, endpoint=f"inproc://row-checks-{next(ENDPOINTS)}", segments=1, env=case.spec,
                    horizon=case.horizon, state_size=case.state_size, max_policy_lag=MAX_LAG, hwm=1,
                    buffer_bytes=65536, limits=Limits(), stop=threading.Event(), registry=registry,
                    rows_per_message=case.rows_per_message, max_abs_value=MAX_ABS)
    try:
        ingest.set_policy_version(POLICY_VERSION)
        message = Message(type=MessageType.ROWS, sender="prop-host", version=POLICY_VERSION, fields=fields,
                          arrays=arrays)
        kept = ingest._accept([zmq.Frame(bytes(frame)) for frame in encode(message)])
        return kept, ingest.counters.take_snapshot()
    finally:
        ingest.socket.close(linger=0)


PROPERTY_SETTINGS = settings(max_examples=25, deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
"""filter_too_much: a mutation that needs action masks (or discrete actions) assumes them, and most random cases have
none; Hypothesis then needs many draws for 25 valid ones, which is expected, not a weak strategy."""


@settings(PROPERTY_SETTINGS, max_examples=200)
@given(case=cases(), seed=st.integers(0, 2 ** 32 - 1))
def test_genuine_messages_are_accepted_and_counted(context, case, seed):
    arrays, fields = genuine(case, np.random.default_rng(seed))
    kept, snapshot = offer(context, case, arrays, fields)
    assert snapshot.messages_dropped == 0, snapshot.messages_dropped_by_reason
    assert kept is not None and len(kept["versions"]) == fields["num_rows"]
    assert (snapshot.env_steps, snapshot.agent_steps) == (fields["env_steps"], fields["agent_steps"])
    assert snapshot.episodes == len(fields["episode_returns"])
    buffers = BatchBuffers.allocate(row_layout(case.spec, horizon=case.horizon, state_size=case.state_size),
                                    fields["num_rows"])
    for name, array in kept.items():
        buffers.arrays[name][:] = array
    to_batch(buffers, torch.device("cpu"))  # the boundary check agrees with the ingest's


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@PROPERTY_SETTINGS
@given(case=cases(), seed=st.integers(0, 2 ** 32 - 1))
def test_each_wrong_message_is_refused_under_its_reason_and_counted_once(context, mutation, case, seed):
    rng = np.random.default_rng(seed)
    arrays, fields = genuine(case, rng)
    mutate, reason = MUTATIONS[mutation]
    mutate(case, arrays, fields, rng)
    kept, snapshot = offer(context, case, arrays, fields)
    assert kept is None
    assert snapshot.messages_dropped_by_reason == {reason: 1} and snapshot.messages_dropped == 1
    assert (snapshot.env_steps, snapshot.agent_steps, snapshot.episodes, snapshot.rows_received) == (0, 0, 0, 0)


def test_the_batch_boundary_names_an_action_out_of_range():
    spec = EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="float32", action=ActionSpace.multi_discrete([3, 2]))
    buffers = BatchBuffers.allocate(row_layout(spec, horizon=3, state_size=0), 2)
    for array in buffers.arrays.values():
        array[...] = 0
    buffers.arrays["actions"][1, 2, 1] = 2
    with pytest.raises(RuntimeError, match=r"'actions' holds 2 at index \(1, 2, 1\).*nvec \[3, 2\]"):
        to_batch(buffers, torch.device("cpu"))
    assert out_of_range_index(np.array([[0, 4], [-1, 0]]), (5,)) == (1, 0)
    assert out_of_range_index(np.array([[0, 4]]), (5,)) is None


def _rules(action: ActionSpace, *, team_rows: bool = False) -> RowRules:
    return RowRules(action=action, mask_size=0, bptt_horizon=3, rows_per_message=2, max_abs_value=MAX_ABS,
                    team_rows=team_rows)


def _logprob_refusal(action: ActionSpace, value: float, *, team_rows: bool = False) -> str | None:
    """The ProtocolError text of check_rows for one row whose step 1 has log-prob ``value``; None if accepted."""
    spec = EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="float32", action=action)
    arrays = row_layout(spec, horizon=4, state_size=0).allocate(1)
    for array in arrays.values():
        array[...] = 0
    arrays["logprobs"][0, 1] = value
    try:
        check_rows(arrays, _rules(action, team_rows=team_rows))
    except ProtocolError as err:
        assert err.reason == "bad_logprob"
        return str(err)
    return None


def test_the_categorical_floor_is_the_log_of_the_smallest_normal_float32_per_component():
    assert LOG_FLOAT32_TINY == pytest.approx(-87.3365, abs=1e-4)
    one, three = ActionSpace.discrete(4), ActionSpace.multi_discrete([3, 2, 5])
    assert _logprob_refusal(one, LOG_FLOAT32_TINY + 0.01) is None
    assert _logprob_refusal(one, 0.0) is None and _logprob_refusal(one, 1e-4) is None
    assert _logprob_refusal(one, -100.0) == ("array 'logprobs' has -100.0 at index (0, 1); a policy over "
                                             "Discrete(4) gives log-probabilities in [-87.3375, 0.001]")
    assert _logprob_refusal(three, 3 * LOG_FLOAT32_TINY + 0.01) is None  # the floor adds up over components
    assert "[-262.011, 0.001]" in _logprob_refusal(three, 3 * LOG_FLOAT32_TINY - 0.01)
    assert "has 0.5 at index (0, 1)" in _logprob_refusal(one, 0.5)


def test_a_gaussian_log_density_may_be_positive_up_to_the_float32_log_std_limit():
    box = ActionSpace.box([-1.0, -1.0], [1.0, 1.0])
    low, high = logprob_bounds(_rules(box))
    assert (low, high) == (-MAX_ABS, pytest.approx(2 * 87.8039, abs=2e-3))
    assert _logprob_refusal(box, 150.0) is None and _logprob_refusal(box, -1e6) is None
    assert "[-1e+06, 175.609]" in _logprob_refusal(box, 176.0)
    assert _logprob_refusal(box, 176.0, team_rows=True) is None  # COMA's tanh-Gaussian: only max_abs_value


def test_episodes_need_steps_in_the_same_message():
    spec = EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="float32", action=ActionSpace.discrete(2))
    sender = Sender(name="h", token=TOKEN, curve_key=None, num_envs=1, agent_slots=1)
    rules = _rules(spec.action)

    def report(agent_steps: int, episodes: int):
        fields = {"num_rows": 1, "env_steps": 9, "agent_steps": agent_steps, "token": TOKEN,
                  "episode_returns": [500.0] * episodes, "episode_lengths": [500] * episodes}
        message = Message(type=MessageType.ROWS, sender="h", version=0, fields=fields, arrays={})
        return read_report(message, sender=sender, rules=rules, stat_names=())

    assert len(report(0, 1).returns) == 1  # an opponent's move may end a game whose last step came earlier
    assert len(report(3, 4).returns) == 4
    with pytest.raises(ProtocolError) as refused:
        report(0, 9)
    assert refused.value.reason == "bad_counter"
    assert str(refused.value) == ("ROWS field 'episode_returns' is 9, more than 1 (agent_steps 0 plus 1 agent slots: "
                                  "each slot's episodes but its first end after a step this message counts)")


def test_a_narrow_float_array_is_bounded_without_overflowing_the_limit():
    """float16 observations against max_abs_value 1e6 (beyond float16's range): no overflow warning, none refused;
    inf stays non_finite; under a limit float16 can hold, a larger value is absurd_value."""
    import warnings

    from learner.serve.row_checks import check_bounded

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" would raise here
        check_bounded("obs", np.array([-65504.0, 0.5, 65504.0], dtype=np.float16), 1e6)
        with pytest.raises(ProtocolError, match=r"array 'obs' has a non-finite value np.float16\(inf\) at index "
                                                r"\(2,\)"):
            check_bounded("obs", np.array([0.0, 1.0, np.inf], dtype=np.float16), 1e6)
        with pytest.raises(ProtocolError, match=r"array 'obs' has 2000.0 at index \(1,\); values must be "
                                                    r"within \+-1000 "):
            check_bounded("obs", np.array([1.0, 2000.0], dtype=np.float16), 1000.0)
