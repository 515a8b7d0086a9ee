"""A ring buffer of transitions with uniform sampling (COMA's replay buffer, seeds/004: capacity 100,000).

Each field (state, observations, actions, reward, flags, ...) is one NumPy array ``[capacity, *shape]`` of the
field's own dtype, so uint8 observations stay uint8. ``add`` writes a batch of transitions at the write position and
wraps around; once full, the oldest transitions are overwritten. ``state_dict`` is plain arrays only (the stored
transitions oldest-first, plus the write position and size as 0-d int64 arrays), so a checkpoint can hold it in
safetensors without pickle.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

FieldSpec = tuple[tuple[int, ...], np.dtype | type | str]
"""(shape of one transition's value, dtype)."""
_POSITION = "position"
_SIZE = "size"
_FIELD_PREFIX = "field."


class ReplayBuffer:
    """Transitions in a ring of ``capacity``; ``sample`` draws uniformly, with replacement, from those stored."""

    def __init__(self, capacity: int, fields: Mapping[str, FieldSpec]) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ReplayBuffer: capacity must be a positive integer, got {capacity!r}")
        if not fields:
            raise ValueError("ReplayBuffer: fields must name at least one field, got none")
        self.capacity = capacity
        self.shapes = {name: tuple(int(d) for d in shape) for name, (shape, _) in fields.items()}
        self.dtypes = {name: np.dtype(dtype) for name, (_, dtype) in fields.items()}
        self.data = {name: np.zeros((capacity, *self.shapes[name]), self.dtypes[name]) for name in fields}
        self.position = 0
        """Index the next transition is written to."""
        self.size = 0
        """Transitions stored (at most capacity)."""

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Mapping[str, np.ndarray]) -> None:
        """Append ``n`` transitions: every field, each ``[n, *shape]``. More than ``capacity`` keeps the newest."""
        count = self._check_batch(batch)
        overwritten = max(0, count - self.capacity)  # written and overwritten within this batch: skipped
        indices = (self.position + np.arange(overwritten, count)) % self.capacity
        for name, values in batch.items():
            self.data[name][indices] = values[overwritten:]
        self.position = int((self.position + count) % self.capacity)
        self.size = min(self.size + count, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``batch_size`` transitions drawn uniformly with replacement: field -> [batch_size, *shape] (copies)."""
        if self.size == 0:
            raise ValueError("ReplayBuffer.sample: the buffer is empty; add transitions first")
        if batch_size < 1:
            raise ValueError(f"ReplayBuffer.sample: batch_size must be >= 1, got {batch_size}")
        indices = rng.integers(0, self.size, size=batch_size)
        return {name: values[indices] for name, values in self.data.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays: ``field.<name>`` holds the stored transitions oldest-first [size, *shape]; ``position`` and
        ``size`` are 0-d int64."""
        order = self._oldest_first()
        state = {f"{_FIELD_PREFIX}{name}": np.ascontiguousarray(values[order]) for name, values in self.data.items()}
        state[_POSITION] = np.array(self.position, np.int64)
        state[_SIZE] = np.array(self.size, np.int64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what ``state_dict`` returned (same fields, shapes and dtypes; size at most capacity)."""
        expected = {f"{_FIELD_PREFIX}{name}" for name in self.data} | {_POSITION, _SIZE}
        if set(state) != expected:
            raise ValueError(f"ReplayBuffer.load_state_dict: keys {sorted(state)} do not match this buffer's "
                             f"{sorted(expected)}")
        size, position = int(state[_SIZE]), int(state[_POSITION])
        if not 0 <= size <= self.capacity or not 0 <= position < self.capacity or (
                size < self.capacity and position != size % self.capacity):
            raise ValueError(f"ReplayBuffer.load_state_dict: size {size} and position {position} do not fit "
                             f"capacity {self.capacity}")
        for name in self.data:
            values = state[f"{_FIELD_PREFIX}{name}"]
            if values.shape != (size, *self.shapes[name]) or values.dtype != self.dtypes[name]:
                raise ValueError(f"ReplayBuffer.load_state_dict: field '{name}' is {values.dtype}{list(values.shape)}, "
                                 f"expected {self.dtypes[name]}{[size, *self.shapes[name]]}")
        first = (position - size) % self.capacity
        indices = (first + np.arange(size)) % self.capacity
        for name in self.data:
            self.data[name][indices] = state[f"{_FIELD_PREFIX}{name}"]
        self.size, self.position = size, position

    def load_share(self, state: Mapping[str, np.ndarray], *, part: int, parts: int) -> None:
        """Add every ``parts``-th transition of a ``state_dict`` (another buffer's, of any capacity), oldest first from
        the ``part``-th: K data-parallel ranks resuming from one saved buffer each take a disjoint share of it."""
        fields = {name: state[f"{_FIELD_PREFIX}{name}"][part::parts] for name in self.data}
        if len(fields[next(iter(fields))]):
            self.add(fields)

    def _oldest_first(self) -> np.ndarray:
        """Indices of the stored transitions, oldest first."""
        first = (self.position - self.size) % self.capacity
        return (first + np.arange(self.size)) % self.capacity

    def _check_batch(self, batch: Mapping[str, np.ndarray]) -> int:
        """The number of transitions in ``batch``; ValueError naming any unknown, missing or misshapen field."""
        unknown = sorted(set(batch) - set(self.data))
        missing = sorted(set(self.data) - set(batch))
        if unknown or missing:
            raise ValueError(f"ReplayBuffer.add: unknown fields {unknown}, missing fields {missing}; the fields are "
                             f"{sorted(self.data)}")
        counts = set()
        for name, values in batch.items():
            values = np.asarray(values)
            if values.shape[1:] != self.shapes[name] or values.ndim != 1 + len(self.shapes[name]):
                expected = ", ".join(["n", *map(str, self.shapes[name])])
                raise ValueError(f"ReplayBuffer.add: field '{name}' has shape {list(values.shape)}, expected "
                                 f"[{expected}]")
            if not np.can_cast(values.dtype, self.dtypes[name], casting="same_kind"):
                raise ValueError(f"ReplayBuffer.add: field '{name}' has dtype {values.dtype}, which does not cast "
                                 f"safely to the field's {self.dtypes[name]}")
            counts.add(values.shape[0])
        if len(counts) != 1:
            sizes = {name: np.asarray(values).shape[0] for name, values in batch.items()}
            raise ValueError(f"ReplayBuffer.add: fields hold different numbers of transitions: {sizes}")
        return counts.pop()
