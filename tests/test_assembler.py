"""RowAssembler against an independent plain-Python model of the same bookkeeping."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from actors import row_kernels
from actors.assembler import RowAssembler
from envs.base import OBS_DTYPES

FIELDS = ("obs", "actions", "logprobs", "values", "rewards", "dones", "bootstrap")


class RefAssembler:
    """Reference model: lists of step dicts, deques of row indices."""

    def __init__(self, num_agents: int, num_rows: int, horizon: int) -> None:
        self.horizon = horizon
        self.free = deque(range(num_rows))
        self.full: deque[tuple[int, list[dict], int]] = deque()
        self.row_of = {a: self.free.popleft() for a in range(num_agents)}
        self.steps: dict[int, list[dict]] = {a: [] for a in range(num_agents)}
        self.version_of: dict[int, int] = {}

    def needed(self, agents: list[int]) -> int:
        return sum(len(self.steps[a]) == self.horizon - 1 for a in agents)

    def add(self, agents: list[int], steps: list[dict], version: int) -> int:
        done_rows = 0
        for a, step in zip(agents, steps):
            if not self.steps[a]:
                self.version_of[a] = version
            self.steps[a].append(step)
            if len(self.steps[a]) == self.horizon:
                self.full.append((self.row_of[a], self.steps[a], self.version_of[a]))
                self.row_of[a] = self.free.popleft()
                self.steps[a] = [step]
                self.version_of[a] = version
                done_rows += 1
        return done_rows

    def pop(self, k: int) -> list[tuple[int, list[dict], int]]:
        return [self.full.popleft() for _ in range(min(k, len(self.full)))]

    def release(self, rows: list[int]) -> None:
        self.free.extend(rows)

    def discard(self, agents: list[int]) -> None:
        for a in agents:
            self.steps[a] = []


def make_steps(rng: np.random.Generator, n: int, obs_shape: tuple[int, ...], obs_dtype: str) -> list[dict]:
    if np.dtype(obs_dtype).kind == "f":
        obs = rng.standard_normal((n, *obs_shape)).astype(obs_dtype)
    else:
        obs = rng.integers(0, 256, (n, *obs_shape)).astype(obs_dtype)
    return [dict(obs=obs[i], actions=int(rng.integers(0, 7)),
                 logprobs=np.float32(rng.standard_normal()), values=np.float32(rng.standard_normal()),
                 rewards=np.float32(rng.standard_normal()), dones=int(rng.random() < 0.2),
                 bootstrap=np.float32(rng.standard_normal())) for i in range(n)]


def add(asm: RowAssembler, agents: list[int], steps: list[dict], version: int) -> int:
    return asm.add_steps(
        np.array(agents, dtype=np.int64),
        np.stack([s["obs"] for s in steps]) if steps else np.empty((0, *asm.layout.obs_shape), asm.arrays["obs"].dtype),
        np.array([s["actions"] for s in steps], dtype=np.int32),
        np.array([s["logprobs"] for s in steps], dtype=np.float32),
        np.array([s["values"] for s in steps], dtype=np.float32),
        np.array([s["rewards"] for s in steps], dtype=np.float32),
        np.array([s["dones"] for s in steps], dtype=bool),
        np.array([s["bootstrap"] for s in steps], dtype=np.float32),
        version)


def check_rows(asm: RowAssembler, got_rows: np.ndarray, expected: list[tuple[int, list[dict], int]]) -> None:
    assert got_rows.dtype == np.int64
    assert got_rows.tolist() == [r for r, _, _ in expected]
    g = asm.gather(got_rows)
    packed = asm.gather_packed(got_rows)  # the same arrays, laid out in one buffer for a packed ROWS message
    assert list(packed.arrays) == list(g)
    for name, array in g.items():
        assert packed.arrays[name].dtype == array.dtype
        assert array.size == 0 or np.shares_memory(packed.arrays[name], packed.buffer)
        np.testing.assert_array_equal(packed.arrays[name], array, err_msg=name)
    assert g["obs"].shape == (len(expected), asm.horizon, *asm.layout.obs_shape)
    assert g["obs"].dtype == asm.arrays["obs"].dtype
    for j, (_, steps, version) in enumerate(expected):
        assert g["versions"][j] == version
        for f in FIELDS:
            want = np.stack([np.asarray(s[f]) for s in steps])
            np.testing.assert_array_equal(g[f][j], want.astype(g[f].dtype), err_msg=f)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("obs_shape,obs_dtype", [((4,), "float32"), ((3, 5, 5), "uint8")])
def test_random_streams_match_reference(seed: int, obs_shape: tuple[int, ...], obs_dtype: str) -> None:
    rng = np.random.default_rng(seed * 7919 + len(obs_shape))
    for horizon in range(2, 10):
        num_agents = int(rng.integers(1, 7))
        num_rows = 2 * num_agents + int(rng.integers(0, 6))
        asm = RowAssembler(num_agents=num_agents, num_rows=num_rows, horizon=horizon,
                           obs_shape=obs_shape, obs_dtype=obs_dtype)
        ref = RefAssembler(num_agents, num_rows, horizon)
        shipped: list[int] = []
        popped_total = 0
        for call in range(300):
            agents = [int(a) for a in rng.permutation(num_agents)[: int(rng.integers(0, num_agents + 1))]]
            if not asm.can_accept(len(agents)) and ref.needed(agents) > len(ref.free):
                with pytest.raises(RuntimeError):
                    add(asm, agents, make_steps(rng, len(agents), obs_shape, obs_dtype), call)
            else:
                steps = make_steps(rng, len(agents), obs_shape, obs_dtype)
                assert add(asm, agents, steps, call) == ref.add(agents, steps, call)
            assert asm.free_rows() == len(ref.free) and asm.full_rows() == len(ref.full)
            if rng.random() < 0.4:
                k = int(rng.integers(0, 4))
                expected = ref.pop(k)
                got = asm.pop_full(k)
                check_rows(asm, got, expected)
                popped_total += len(got)
                shipped.extend(got.tolist())
            if shipped and rng.random() < 0.4:
                order = rng.permutation(len(shipped))
                give = [shipped[i] for i in order[: int(rng.integers(1, len(shipped) + 1))]]
                shipped = [r for r in shipped if r not in give]
                asm.release(np.array(give))
                ref.release(give)
            if rng.random() < 0.05:
                gone = [int(a) for a in rng.choice(num_agents, int(rng.integers(1, num_agents + 1)), replace=False)]
                asm.discard_agents(np.array(gone))
                ref.discard(gone)
        assert popped_total > num_rows  # the rings wrapped at least once


def small(horizon: int = 4, num_agents: int = 2, num_rows: int = 6) -> RowAssembler:
    return RowAssembler(num_agents=num_agents, num_rows=num_rows, horizon=horizon,
                        obs_shape=(2,), obs_dtype="float32")


def step_one(asm: RowAssembler, agent: int, value: float, version: int = 0, done: bool = False) -> int:
    return add(asm, [agent], [dict(obs=np.full(2, value, np.float32), actions=int(value), logprobs=value,
                                   values=value, rewards=value, dones=int(done), bootstrap=value)], version)


def test_rows_overlap_by_one_step_and_ignore_episode_ends() -> None:
    asm = small(horizon=4)
    for t in range(10):
        step_one(asm, 0, float(t), version=100 + t, done=(t == 1))  # episode ends mid-row
    rows = asm.pop_full(10)
    assert len(rows) == 3
    g = asm.gather(rows)
    np.testing.assert_array_equal(g["values"], [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]])
    np.testing.assert_array_equal(g["dones"][0], [0, 1, 0, 0])
    np.testing.assert_array_equal(g["obs"][1, 0], g["obs"][0, -1])
    assert g["versions"].tolist() == [100, 103, 106]  # version of each row's first step


def test_discard_agents_restarts_row_without_overlap() -> None:
    asm = small(horizon=3)
    step_one(asm, 0, 1.0, version=1)
    step_one(asm, 0, 2.0, version=2)
    row = int(asm.ep_indices[0])
    asm.discard_agents(np.array([0]))
    assert asm.ep_lengths[0] == 0 and asm.ep_indices[0] == row
    for v in (5.0, 6.0, 7.0):
        step_one(asm, 0, v, version=int(v))
    (got,) = asm.pop_full(5)
    assert got == row
    g = asm.gather([got])
    np.testing.assert_array_equal(g["values"][0], [5, 6, 7])
    assert g["versions"][0] == 5


def test_too_few_rows_and_bad_horizon_rejected() -> None:
    with pytest.raises(ValueError, match="100 agents need at least 200 rows .*got 150"):
        RowAssembler(num_agents=100, num_rows=150, horizon=4, obs_shape=(1,), obs_dtype="float32")
    with pytest.raises(ValueError, match="horizon"):
        RowAssembler(num_agents=1, num_rows=2, horizon=1, obs_shape=(1,), obs_dtype="float32")


def test_free_ring_exhaustion_raises_and_changes_nothing() -> None:
    asm = small(horizon=2, num_agents=2, num_rows=4)
    assert asm.free_rows() == 2 and asm.can_accept(2) and not asm.can_accept(3)
    step_one(asm, 0, 1.0)
    for v in (2.0, 3.0):
        assert step_one(asm, 0, v) == 1
    assert asm.free_rows() == 0 and asm.full_rows() == 2
    step_one(asm, 1, 9.0)  # position 0 needs no new row: still fine
    before = (asm.ep_lengths.copy(), asm.ep_indices.copy(), asm.arrays["values"].copy(), asm.rings.copy())
    with pytest.raises(RuntimeError, match="free rows"):
        add(asm, [1, 0], [dict(obs=np.zeros(2, np.float32), actions=0, logprobs=0, values=0,
                               rewards=0, dones=0, bootstrap=0)] * 2, 0)
    after = (asm.ep_lengths, asm.ep_indices, asm.arrays["values"], asm.rings)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)
    asm.release(asm.pop_full(1))
    assert step_one(asm, 0, 4.0) == 1


def test_bad_inputs_rejected() -> None:
    asm = small()
    with pytest.raises(ValueError, match="distinct"):
        add(asm, [0, 0], [dict(obs=np.zeros(2, np.float32), actions=0, logprobs=0, values=0,
                               rewards=0, dones=0, bootstrap=0)] * 2, 0)
    with pytest.raises(ValueError, match="out of range"):
        step_one(asm, 5, 0.0)
    with pytest.raises(ValueError, match="pop_full"):
        asm.release(np.array([asm.ep_indices[0]]))  # a row still being written
    for v in range(5):
        step_one(asm, 0, float(v))
    rows = asm.pop_full(10)
    with pytest.raises(ValueError):
        asm.release(np.concatenate([rows, rows]))  # double release within one call
    asm.release(rows)
    with pytest.raises(ValueError):
        asm.release(rows)  # already released
    assert asm.free_rows() == 4


def test_poison_and_numba_compiled() -> None:
    asm = RowAssembler(num_agents=1, num_rows=2, horizon=2, obs_shape=(3,), obs_dtype="uint8")
    arrays = asm.arrays
    assert (arrays["obs"] == 0xA5).all() and np.isnan(arrays["values"]).all() and (arrays["actions"] == -1).all()
    other = small(horizon=2)
    assert step_one(other, 0, 1.0) == 0 and step_one(other, 0, 2.0) == 1
    other.release(other.pop_full(3))
    for kernel in (row_kernels.add_steps_kernel, row_kernels.pop_full_kernel, row_kernels.release_kernel):
        assert len(kernel.signatures) > 0


def test_one_compiled_add_kernel_serves_every_layout() -> None:
    """Fields move as bytes through the offset table: layouts of other shapes, dtypes, states and masks add no
    compiled specialisation (a new env compiles nothing at its host's start)."""
    for obs_shape, obs_dtype, state_size, mask_size in (((3,), "float64", 0, 0), ((2, 3, 3), "uint8", 4, 0),
                                                        ((5,), "int16", 0, 7), ((1,), "bool", 2, 3)):
        asm = RowAssembler(num_agents=2, num_rows=4, horizon=2, obs_shape=obs_shape, obs_dtype=obs_dtype,
                           state_size=state_size, mask_size=mask_size, action_shape=(2,))
        asm.warm_up()
        staged = asm.stage(2)
        asm.add_staged(staged, np.array([1, 0]), 3)
    assert len(row_kernels.add_steps_kernel.signatures) == 1


def test_staged_inputs_of_another_assembler_are_refused() -> None:
    asm, other = small(), small()
    with pytest.raises(ValueError, match="another assembler's"):
        asm.add_staged(other.stage(2), np.array([0]), 0)


def fill_staged(staged, values: dict[str, np.ndarray]) -> None:
    for name, value in values.items():
        staged.arrays[name][:len(value)] = value


@pytest.mark.parametrize("state_size,mask_size", [(0, 0), (3, 5)])
def test_staged_adds_write_the_same_rows_as_add_bit_for_bit(state_size: int, mask_size: int) -> None:
    """The host's hot path (``stage`` once, then ``add_staged`` on arrays written in place) against ``add`` with
    the same values as the reference: every buffer, ring and count equal after every call."""
    rng = np.random.default_rng(state_size + 17)
    shape = dict(num_agents=6, num_rows=16, horizon=5, obs_shape=(3, 4), obs_dtype="uint8", state_size=state_size,
                 mask_size=mask_size)
    staged_asm, reference = RowAssembler(**shape), RowAssembler(**shape)
    staged = staged_asm.stage(6)
    assert (staged.arrays["obs"] == 0xA5).all() and np.isnan(staged.arrays["values"]).all()  # poison until written
    assert set(staged.arrays) == {"obs", "actions", "logprobs", "values", "rewards", "dones", "bootstrap"} | (
        {"states", "action_masks"} if state_size else set())
    for call in range(200):
        agents = rng.permutation(6)[:int(rng.integers(0, 7))].astype(np.int64)
        n = len(agents)
        values = dict(obs=rng.integers(0, 256, (n, 3, 4), dtype=np.uint8), actions=rng.integers(0, 9, n, np.int32),
                      logprobs=rng.standard_normal(n).astype(np.float32),
                      values=rng.standard_normal(n).astype(np.float32),
                      rewards=rng.standard_normal(n).astype(np.float32), dones=(rng.random(n) < 0.2).astype(np.uint8),
                      bootstrap=rng.standard_normal(n).astype(np.float32))
        if state_size:
            values.update(states=rng.standard_normal((n, state_size)).astype(np.float32),
                          action_masks=rng.integers(0, 2, (n, mask_size), dtype=np.uint8))
        if not reference.can_accept(n):
            full = reference.pop_full(16)
            reference.release(full)
            staged_asm.release(staged_asm.pop_full(16))
        version = call // 7
        fill_staged(staged, values)
        assert staged_asm.add_staged(staged, agents, version) == reference.add(agents, version, **values)
        for name, array in reference.arrays.items():
            np.testing.assert_array_equal(staged_asm.arrays[name], array, err_msg=name)
        for got, want in zip(staged_asm._book[:-1], reference._book[:-1]):  # the last is the kernel's scratch
            np.testing.assert_array_equal(got, want)
    assert reference.full_rows() + reference.free_rows() > 0


def test_staged_add_rejects_what_add_rejects_and_changes_nothing() -> None:
    asm = small()
    staged = asm.stage(2)
    before = {name: array.copy() for name, array in asm.arrays.items()}
    with pytest.raises(ValueError, match="distinct"):
        asm.add_staged(staged, np.array([0, 0]), 0)
    with pytest.raises(ValueError, match="out of range"):
        asm.add_staged(staged, np.array([7]), 0)
    with pytest.raises(ValueError, match="3 steps exceed the staged arrays' 2"):
        asm.add_staged(staged, np.array([0, 1, 2]), 0)
    for name, array in asm.arrays.items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        asm.stage(0)


def test_prefetch_is_a_compiled_hint_that_changes_nothing() -> None:
    import numba

    from actors.prefetch import prefetch_for_write

    @numba.njit
    def touch(buffer, rows):
        for row in rows:
            prefetch_for_write(buffer, row, buffer.shape[1] - 1, buffer.shape[2] - 1)
            prefetch_for_write(buffer, row, 0, 0)

    for dtype in ("uint8", "float32", "int64"):
        buffer = np.arange(4 * 3 * 5).astype(dtype).reshape(4, 3, 5)
        before = buffer.copy()
        touch(buffer, np.array([0, 3, 1]))
        np.testing.assert_array_equal(buffer, before)
    with pytest.raises(numba.TypingError):  # 3-d arrays only: a 2-d one is a compile-time error, not a stray read
        touch(np.zeros((2, 2)), np.array([0]))


def test_rows_with_states_masks_and_action_vectors_match_reference() -> None:
    """Every field of a layout with a recurrent state (per row: the state before the row's first step), action masks
    and multi-component actions, against the plain-Python reference, through the one byte-moving kernel."""
    rng = np.random.default_rng(11)
    num_agents, horizon = 5, 4
    asm = RowAssembler(num_agents=num_agents, num_rows=14, horizon=horizon, obs_shape=(3, 2), obs_dtype="float64",
                       state_size=3, action_shape=(2,), mask_size=5)
    ref = RefAssembler(num_agents, 14, horizon)
    expected_states: dict[int, np.ndarray] = {}  # row -> the state it was opened with
    for call in range(120):
        agents = [int(a) for a in rng.permutation(num_agents)[:int(rng.integers(1, num_agents + 1))]]
        if ref.needed(agents) > len(ref.free):
            for row, _, _ in ref.pop(len(ref.full)):
                asm.release(asm.pop_full(1))
                ref.release([row])
        steps = make_steps(rng, len(agents), (3, 2), "float64")
        for step in steps:
            step.update(actions=rng.integers(0, 7, 2).astype(np.int32),
                        action_masks=rng.integers(0, 2, 5).astype(np.uint8),
                        states=rng.standard_normal(3).astype(np.float32))
        rows_before = {a: ref.row_of[a] for a in agents}
        lengths_before = {a: len(ref.steps[a]) for a in agents}
        arrays = {f: np.stack([np.asarray(s[f]) for s in steps]) for f in (*FIELDS, "action_masks", "states")}
        assert asm.add(np.array(agents), call, **arrays) == ref.add(agents, steps, call)
        for a, step in zip(agents, steps):  # a row keeps the state of the step that opens it
            if lengths_before[a] == 0:
                expected_states[rows_before[a]] = step["states"]
            if lengths_before[a] == horizon - 1:
                expected_states[ref.row_of[a]] = step["states"]
        if rng.random() < 0.5:
            expected = ref.pop(2)
            got = asm.pop_full(2)
            g = asm.gather(got)
            assert got.tolist() == [row for row, _, _ in expected]
            for j, (row, row_steps, version) in enumerate(expected):
                assert g["versions"][j] == version
                np.testing.assert_array_equal(g["states"][j], expected_states[row])
                for f in (*FIELDS, "action_masks"):
                    want = np.stack([np.asarray(s[f]) for s in row_steps]).astype(g[f].dtype)
                    np.testing.assert_array_equal(g[f][j], want, err_msg=f)
            asm.release(got)
            ref.release(got.tolist())


@pytest.mark.parametrize("obs_dtype", OBS_DTYPES)
def test_every_carried_observation_dtype_goes_through_the_compiled_assembler(obs_dtype: str) -> None:
    """EnvSpec.obs_dtype admits only what the compiled kernel has a type for: rows match the reference for each."""
    rng = np.random.default_rng(5)
    asm = RowAssembler(num_agents=2, num_rows=6, horizon=3, obs_shape=(3,), obs_dtype=obs_dtype)
    ref = RefAssembler(2, 6, 3)
    for call in range(12):
        steps = make_steps(rng, 2, (3,), obs_dtype)
        assert add(asm, [0, 1], steps, call) == ref.add([0, 1], steps, call)
        got, expected = asm.pop_full(2), ref.pop(2)
        check_rows(asm, got, expected)
        asm.release(got)
        ref.release(got.tolist())
    assert asm.arrays["obs"].dtype == np.dtype(obs_dtype)


def test_gather_packed_refuses_rows_out_of_range() -> None:
    asm = RowAssembler(num_agents=2, num_rows=6, horizon=3, obs_shape=(5,), obs_dtype="uint8")
    for rows in ([6], [0, -1]):
        with pytest.raises(ValueError, match=r"gather_packed takes rows in \[0, 6\), got"):
            asm.gather_packed(np.array(rows))
