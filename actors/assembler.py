"""Segment assembler: packs per-agent steps into fixed rows of ``horizon = bptt_horizon + 1`` steps.

Each agent owns one row being written (``ep_indices[agent]``) and a write position (``ep_lengths[agent]``).
When a row fills it moves to the FULL ring and the agent takes a fresh row from the FREE ring. The last
step of a full row is copied to position 0 of the agent's next row, so every transition inside a row has a
bootstrap value. Rows are never cut at episode ends: ``dones`` are just data the learner masks with.
Ownership of row indices cycles FREE -> writing -> FULL -> shipped (``pop_full``) -> FREE (``release``);
the data itself never moves.

The fields, their shapes and dtypes, and what each step's values mean: ``protocol.rows.ROW_FIELDS``. The
assembler keeps one buffer per field, holding the field's poison value until written; every buffer is a view of
one byte block (the pool), and a call's inputs are views of another (``StagedSteps``).

The hot paths are ``numba.njit`` kernels over those blocks (``actors/row_kernels.py``); the class only validates and
dispatches. The add kernel moves each field as bytes (or 4-byte words) through a table of offsets, so one compiled
kernel serves every env's layout (no compile per observation shape or dtype) and a call passes it a few arrays, not
two per field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from actors.row_kernels import (ERR_BAD_AGENT, ERR_DUP_AGENT, ERR_NO_FREE, FREE, FREE_COUNT, FREE_HEAD, FULL_COUNT,
                                WRITING, add_steps_kernel, gather_kernel, pop_full_kernel, release_kernel)
from protocol.framing import PackedArrays, PackedLayout, dtype_name
from protocol.rows import ROW_FIELDS, RowField, RowLayout

_ALIGN_BYTES = 64
"""Each field's place in the pool and in the staged inputs starts on a multiple of this (a cache line: no two
fields share one, and every dtype's alignment holds)."""

VERSIONS = "versions"
"""The per-row field that ``add``'s ``version`` argument fills (the policy version of a row's first step)."""

SAME_KIND = frozenset({"obs"})
"""Fields whose values must cast to the buffer's dtype within their kind (observations keep the env's dtype end
to end); the others are cast as NumPy casts (float placeholders for integer actions or dones included)."""


def _carve(specs: dict[str, tuple[tuple[int, ...], np.dtype, np.generic]]) -> tuple[np.ndarray, dict[str, np.ndarray],
                                                                                   dict[str, int]]:
    """One uint8 block holding an array per ``specs`` entry (name -> shape, dtype, fill value), each at an
    ``_ALIGN_BYTES`` multiple and filled: the block, the arrays (views of it) and each one's byte offset."""
    offsets, sizes, total = {}, {}, 0
    for name, (shape, dtype, _) in specs.items():
        offsets[name], sizes[name] = total, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        total += -(-sizes[name] // _ALIGN_BYTES) * _ALIGN_BYTES
    block = np.empty(total, dtype=np.uint8)
    arrays = {}
    for name, (shape, dtype, fill) in specs.items():
        array = block[offsets[name]:offsets[name] + sizes[name]].view(dtype).reshape(shape)
        array.fill(fill)
        arrays[name] = array
    return block, arrays, offsets


@dataclass(frozen=True, kw_only=True)
class _Buffer:
    """One field's buffer, as ``add`` checks its input and the kernel writes it."""

    name: str
    """The field's name."""
    per_step: bool
    """Whether the field has a value per step (else per row)."""
    value_shape: tuple[int, ...]
    """One agent's value as ``add`` takes it: [n, *value_shape]."""
    dtype: np.dtype
    """The buffer's dtype."""
    same_kind: bool
    """Whether an input of another kind of dtype is a TypeError (SAME_KIND)."""
    width: int
    """Elements in one value (0: a field this layout does not have, which the kernel skips)."""
    poison: np.generic
    """The value the buffer, and a staged input, hold until written."""


@dataclass(frozen=True, kw_only=True)
class StagedSteps:
    """Reused inputs of ``RowAssembler.add_staged``: the caller writes one call's steps into the first rows of
    ``arrays`` in place (no allocation, no per-call checks); they hold the fields' poison values until written."""

    capacity: int
    """Steps one call records at most."""
    arrays: dict[str, np.ndarray]
    """Field name -> [capacity, *value_shape] in the field's dtype, for every input field of width > 0 (views of
    ``block``)."""
    versions: np.ndarray
    """[capacity, 1] int64: the versions field's input, which ``add_staged`` fills with its version argument."""
    block: np.ndarray
    """The uint8 block every input array lives in: the kernel's ``inputs``."""
    table: np.ndarray
    """The kernel's field table for this block and its assembler's pool: [fields, 4] int64."""
    fields: tuple[str, ...]
    """The field of each of ``table``'s rows."""
    pool: np.ndarray
    """The pool of the assembler these inputs are for (its table's pool offsets are that pool's)."""


class RowAssembler:
    """Fixed pool of ``num_rows`` rows of ``horizon`` steps, cycled through FREE and FULL rings."""

    def __init__(self, *, num_agents: int, num_rows: int, horizon: int, obs_shape: tuple[int, ...],
                 obs_dtype: str, state_size: int = 0, action_shape: tuple[int, ...] = (),
                 action_dtype: str = "int32", mask_size: int = 0, team_size: int = 0,
                 global_state_size: int = 0) -> None:
        """``num_agents``: the row writers (agent slots; envs for team rows); the rest is the ``RowLayout``."""
        if num_agents < 1:
            raise ValueError(f"num_agents must be >= 1, got {num_agents}")
        if num_rows < 2 * num_agents:
            raise ValueError(
                f"row buffer too small: {num_agents} agents need at least {2 * num_agents} rows "
                f"(one being written and one free per agent), got {num_rows}")
        if horizon < 2:
            raise ValueError(f"horizon must be >= 2 (bptt_horizon + 1), got {horizon}")
        self.num_agents, self.num_rows, self.horizon = num_agents, num_rows, horizon
        self.layout = RowLayout(horizon=horizon, obs_shape=obs_shape, obs_dtype=obs_dtype, action_shape=action_shape,
                                action_dtype=action_dtype, mask_size=mask_size, state_size=state_size,
                                team_size=team_size, global_state_size=global_state_size)
        self._buffers = tuple(self._buffer(f) for f in ROW_FIELDS)
        self._pool, arrays, self._pool_offsets = _carve({
            f.name: ((num_rows, *self.layout.row_shape(f)), self.layout.dtype(f), self.layout.poison(f))
            for f in ROW_FIELDS})
        self.arrays = arrays
        """Field -> every row's buffer, in its wire shape (views of one block, the kernel's pool)."""
        self._packed: dict[int, tuple[PackedLayout, np.ndarray]] = {}
        """Row count -> the packed ROWS layout of that many rows and the gather kernel's table of it."""
        self._inputs = frozenset(f.name for f in ROW_FIELDS) - {VERSIONS}
        R = num_rows
        self.free_ring = np.arange(R, dtype=np.int64)
        self.full_ring = np.full(R, -1, dtype=np.int64)
        self.rings = np.array([0, R, 0, 0], dtype=np.int64)  # free head/count, full head/count
        self.row_state = np.full(R, FREE, dtype=np.int8)
        # Every agent takes one row from the free ring.
        self.ep_indices = self.free_ring[:num_agents].copy()
        self.ep_lengths = np.zeros(num_agents, dtype=np.int64)
        self.rings[FREE_HEAD] = num_agents
        self.rings[FREE_COUNT] = R - num_agents
        self.row_state[self.ep_indices] = WRITING
        self._seen = np.full(num_agents, -1, dtype=np.int64)  # duplicate-agent detection scratch
        self._stamp = 0
        dest = np.empty((num_agents, 3), dtype=np.int64)  # the kernel's per-step (row, position, new row)
        self._book = (self.ep_indices, self.ep_lengths, self.free_ring, self.full_ring, self.rings, self.row_state,
                      self._seen, dest)
        self._add_inputs: StagedSteps | None = None
        """``add``'s reused inputs (made at its first call, grown when a call brings more steps)."""

    @classmethod
    def for_layout(cls, layout: RowLayout, *, num_agents: int, num_rows: int) -> "RowAssembler":
        """An assembler of ``layout``'s rows for ``num_agents`` row writers."""
        return cls(num_agents=num_agents, num_rows=num_rows, horizon=layout.horizon, obs_shape=layout.obs_shape,
                   obs_dtype=layout.obs_dtype, state_size=layout.state_size, action_shape=layout.action_shape,
                   action_dtype=layout.action_dtype, mask_size=layout.mask_size, team_size=layout.team_size,
                   global_state_size=layout.global_state_size)

    def warm_up(self) -> None:
        """Compile the numba kernels now (on a cold cache that takes seconds; one kernel serves every layout, as it
        moves bytes) on a throwaway two-row assembler of the same layout, so the host's first steps do not wait for
        the compiler. Leaves this assembler untouched."""
        spare = RowAssembler.for_layout(self.layout, num_agents=1, num_rows=2)
        agent = np.zeros(1, dtype=np.int64)
        values = {buffer.name: np.zeros((1, *buffer.value_shape), dtype=buffer.dtype)
                  for buffer in spare._buffers if buffer.name != VERSIONS and buffer.width}
        for _ in range(spare.horizon):  # fills one row: the kernel's path that opens the agent's next row too
            spare.add(agent, 0, **values)
        spare.release(spare.pop_full(1))
        spare.gather_packed(np.zeros(1, dtype=np.int64))  # compiled here, not at the first ship

    def _buffer(self, field: RowField) -> _Buffer:
        value_shape = self.layout.value_shape(field)
        return _Buffer(name=field.name, per_step=field.per_step, value_shape=value_shape,
                       dtype=self.layout.dtype(field), same_kind=field.name in SAME_KIND,
                       width=int(np.prod(value_shape, dtype=np.int64)), poison=self.layout.poison(field))

    def free_rows(self) -> int:
        """Rows available for agents to move into."""
        return int(self.rings[FREE_COUNT])

    def full_rows(self) -> int:
        """Completed rows waiting to be popped."""
        return int(self.rings[FULL_COUNT])

    def can_accept(self, num_steps: int) -> bool:
        """Whether ``num_steps`` agent steps surely fit (each completes at most one row)."""
        return self.free_rows() >= num_steps

    def add_steps(self, agent_ids: np.ndarray, obs: np.ndarray, actions: np.ndarray,
                  logprobs: np.ndarray, values: np.ndarray, rewards: np.ndarray, dones: np.ndarray,
                  bootstrap: np.ndarray, version: int, states: np.ndarray | None = None,
                  action_masks: np.ndarray | None = None, **more: np.ndarray) -> int:
        """:meth:`add` with the fields every env has as positional arguments; ``more`` holds any further row field
        by name."""
        return self.add(agent_ids, version, obs=obs, actions=actions, logprobs=logprobs, values=values,
                        rewards=rewards, dones=dones, bootstrap=bootstrap, states=states, action_masks=action_masks,
                        **more)

    def stage(self, capacity: int) -> StagedSteps:
        """Reused input arrays for ``add_staged`` calls of up to ``capacity`` steps, built and checked once."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        written = [buffer for buffer in self._buffers if buffer.width]
        block, arrays, offsets = _carve({buffer.name: ((capacity, *buffer.value_shape), buffer.dtype, buffer.poison)
                                         for buffer in written})
        table = np.array([(offsets[buffer.name], buffer.width * buffer.dtype.itemsize,
                           self._pool_offsets[buffer.name], int(buffer.per_step)) for buffer in written],
                         dtype=np.int64).reshape(-1, 4)
        versions = arrays.pop(VERSIONS).reshape(capacity, 1)
        return StagedSteps(capacity=capacity, arrays=arrays, versions=versions, block=block, table=table,
                           fields=tuple(buffer.name for buffer in written), pool=self._pool)

    def add_staged(self, staged: StagedSteps, agent_ids: np.ndarray, version: int) -> int:
        """:meth:`add` of the first ``len(agent_ids)`` values of each of ``staged``'s arrays (from this assembler's
        ``stage``), which the caller wrote in place: no per-call check of shapes or dtypes. Same rows, same errors
        (all-or-nothing) as ``add`` with those values."""
        if len(agent_ids) > staged.capacity:
            raise ValueError(f"{len(agent_ids)} steps exceed the staged arrays' {staged.capacity}")
        if staged.pool is not self._pool:
            raise ValueError("these staged arrays are another assembler's (stage them with this one)")
        ids = np.ascontiguousarray(agent_ids, dtype=np.int64).reshape(-1)
        if staged.versions[0, 0] != version:  # one value per step, of which the kernel reads the first n
            staged.versions.fill(version)
        self._stamp += 1
        rc = add_steps_kernel(ids, np.int64(self._stamp), staged.block, staged.table, self._pool, self.horizon,
                               *self._book)
        if rc == ERR_NO_FREE:
            raise RuntimeError(f"row assembler out of free rows ({self.free_rows()} free, "
                               f"{self.full_rows()} full); check can_accept() before add_steps()")
        if rc == ERR_BAD_AGENT:
            raise ValueError(f"agent id out of range [0, {self.num_agents})")
        if rc == ERR_DUP_AGENT:
            raise ValueError("agent_ids must be distinct within one add_steps call")
        return int(rc)

    def add(self, agent_ids: np.ndarray, version: int, **fields: np.ndarray | None) -> int:
        """Append one step for each of the distinct ``agent_ids``; return the number of rows completed.

        ``fields`` has every field of ``protocol.rows.ROW_FIELDS`` but ``versions`` (``version`` fills it),
        each [n, *value_shape] in (or cast to) the field's dtype: a per-step field's values of this step, a
        per-row field's values before this step (``states``: each agent's recurrent state before this step's
        forward pass), kept only where the step opens a row. A field of width 0 may be omitted or None.

        All-or-nothing: on error (RuntimeError for an exhausted free ring, ValueError for bad or
        repeated agent ids or a missing, unknown or misshapen field, TypeError for observations of another
        kind of dtype) no state is modified.
        """
        ids = np.ascontiguousarray(agent_ids, dtype=np.int64).reshape(-1)
        n = len(ids)
        if not fields.keys() <= self._inputs:
            raise ValueError(f"unknown row field(s) {sorted(fields.keys() - self._inputs)}: add() takes the fields "
                             f"of protocol.rows.ROW_FIELDS but {VERSIONS!r}, which its version argument fills")
        values = {buffer.name: _kernel_input(buffer, fields.get(buffer.name), n)  # all checked before any is copied
                  for buffer in self._buffers
                  if buffer.name != VERSIONS and (buffer.width or fields.get(buffer.name) is not None)}
        if self._add_inputs is None or self._add_inputs.capacity < n:
            self._add_inputs = self.stage(max(n, self.num_agents))
        staged = self._add_inputs
        for name, array in staged.arrays.items():
            array[:n] = values[name]
        return self.add_staged(staged, ids, version)

    def pop_full(self, max_rows: int) -> np.ndarray:
        """Remove and return up to ``max_rows`` full row indices (int64), oldest first."""
        out = np.empty(max(0, min(int(max_rows), self.full_rows())), dtype=np.int64)
        k = pop_full_kernel(self.full_ring, self.rings, self.row_state, out)
        return out[:k]

    def release(self, rows: np.ndarray) -> None:
        """Give shipped rows (from ``pop_full``) back to the FREE ring. Rejects any other row."""
        r = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if release_kernel(r, self.free_ring, self.rings, self.row_state) != 0:
            raise ValueError("release() takes only rows returned by pop_full() and not yet released")

    def discard_agents(self, agent_ids: np.ndarray) -> None:
        """Drop the partially written rows of these agents; each keeps its row and restarts at 0."""
        ids = np.asarray(agent_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_agents):
            raise ValueError(f"agent id out of range [0, {self.num_agents})")
        self.ep_lengths[ids] = 0

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of every field for ``rows``, in ROWS message order and wire shapes."""
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        return {name: array[r] for name, array in self.arrays.items()}

    def gather_packed(self, rows: np.ndarray, into: np.ndarray | None = None) -> PackedArrays:
        """What ``gather`` returns, laid out as a packed ROWS message carries it (one compiled copy of every field's
        bytes), in one fresh buffer or at the start of ``into`` (uint8, ``packed_bytes(len(rows))`` at least)."""
        r = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        layout, table = self._packed.get(len(r)) or self._packed_layout(len(r))
        packed = layout.allocate(into)
        if gather_kernel(r, self.num_rows, self._pool, table, packed.buffer) != 0:
            raise ValueError(f"gather_packed takes rows in [0, {self.num_rows}), got {r.min()}..{r.max()}")
        return packed

    def packed_bytes(self, n: int) -> int:
        """The bytes of ``n`` rows packed."""
        return (self._packed.get(n) or self._packed_layout(n))[0].total

    def _packed_layout(self, n: int) -> tuple[PackedLayout, np.ndarray]:
        """The packed layout of ``n`` rows and the gather kernel's table of it ([fields, 3]: the field's offset in
        the pool, bytes per row, offset in the payload), made once per row count."""
        layout = PackedLayout.of([(name, dtype_name(array.dtype), (n, *array.shape[1:]))
                                  for name, array in self.arrays.items()])
        table = np.array([(self._pool_offsets[name], array[:1].nbytes, offset)
                          for (name, array), offset in zip(self.arrays.items(), layout.offsets)], dtype=np.int64)
        self._packed[n] = layout, table
        return layout, table


def _kernel_input(buffer: _Buffer, value: np.ndarray | None, n: int) -> np.ndarray:
    """``value`` ([n, *value_shape]) checked and converted to the buffer's dtype."""
    if value is None:
        raise ValueError(f"{buffer.name} shape: missing, expected {(n, *buffer.value_shape)}")
    array = np.asarray(value)
    if array.shape[1:] != buffer.value_shape or array.ndim == 0 or len(array) != n:
        raise ValueError(f"{buffer.name} shape {array.shape} != {(n, *buffer.value_shape)}")
    if buffer.same_kind and not np.can_cast(array.dtype, buffer.dtype, casting="same_kind"):
        raise TypeError(f"{buffer.name} dtype {array.dtype} cannot be stored as {buffer.dtype}")
    return np.asarray(array, dtype=buffer.dtype)
