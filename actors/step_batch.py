"""One inference step's batch, read in one compiled pass over the host's shared memory.

``StepBatch.scan`` takes the ready groups and, in one ``numba`` pass over their slots' flags in shared memory (no
Python per group or per slot), lists the batch's host-wide slot ids and sorts them into: the learner's active slots
(acted for and recorded), the opponents' active slots (self-play: acted for, never recorded), the slots whose
episode ended on this step (episode statistics), the slots whose recurrent state resets, and the truncated ones
(their bootstrap value). The same pass copies each recorded slot's observation, action mask, reward and done flag
into the batch's reused arrays (the row assembler's staged inputs, which the policy reads too). Observations and
masks are copied as bytes, so one compiled pass serves every observation shape and dtype. Every array is allocated
once, at the host's start, for the largest batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from actors.slot_layout import GroupView

_CHOSEN, _THEIRS, _ENDED, _RESET, _TRUNCATED = range(5)
"""Rows of ``StepBatch``'s positions array and of the counts ``_scan`` returns."""


@numba.njit(cache=True)
def _scan(starts, per_group, active, learner, terminated, truncated, episode_done, rewards_in, obs_in, masks_in,
          ids, agent_ids, positions, counts, obs, masks, rewards, dones):
    """List and sort the batch's slots (see the module docstring) into ``ids``, ``agent_ids`` and ``positions``,
    their numbers into ``counts``. ``obs_in``, ``masks_in`` and their outputs: [slots or capacity, bytes] uint8
    views; ``learner`` has length 0 when every slot is the learner's."""
    counts[:] = 0
    everyone = learner.shape[0] == 0
    obs_bytes = obs.shape[1]
    mask_bytes = masks.shape[1]
    i = 0
    for g in range(starts.shape[0]):
        for s in range(starts[g], starts[g] + per_group):
            ids[i] = s
            if episode_done[s]:
                positions[_ENDED, counts[_ENDED]] = s
                counts[_ENDED] += 1
            if not active[s]:
                i += 1
                continue
            if not everyone and not learner[s]:
                positions[_THEIRS, counts[_THEIRS]] = i
                counts[_THEIRS] += 1
                i += 1
                continue
            n = counts[_CHOSEN]
            done = terminated[s] or truncated[s]
            if done:
                positions[_RESET, counts[_RESET]] = s
                counts[_RESET] += 1
            if truncated[s]:
                positions[_TRUNCATED, counts[_TRUNCATED]] = n
                counts[_TRUNCATED] += 1
            positions[_CHOSEN, n] = i
            agent_ids[n] = s
            for b in range(obs_bytes):
                obs[n, b] = obs_in[s, b]
            for b in range(mask_bytes):
                masks[n, b] = masks_in[s, b]
            rewards[n] = rewards_in[s]
            dones[n] = 1 if done else 0
            counts[_CHOSEN] = n + 1
            i += 1


@dataclass(slots=True, kw_only=True)
class ScannedBatch:
    """What ``StepBatch.scan`` found in one batch (views of the batch's reused arrays, valid until the next scan)."""

    ids: np.ndarray
    """[n] host-wide slot ids of the batch's groups, group after group."""
    agent_ids: np.ndarray
    """Slot ids of the learner's active slots, in order (acted for and recorded): ``ids[chosen]``."""
    positions: np.ndarray
    """[5, n] the lists below, each the first ``counts[k]`` of its row."""
    counts: np.ndarray
    """[5] how many each list holds."""

    @property
    def all_chosen(self) -> bool:
        """Whether every slot of the batch is chosen (``agent_ids`` equal ``ids``)."""
        return len(self.agent_ids) == len(self.ids)

    @property
    def any_theirs(self) -> bool:
        """Whether opponents' slots act in this batch."""
        return bool(self.counts[_THEIRS])

    @property
    def any_ended(self) -> bool:
        """Whether an episode ended on this step."""
        return bool(self.counts[_ENDED])

    @property
    def any_reset(self) -> bool:
        """Whether a chosen slot's recurrent state resets."""
        return bool(self.counts[_RESET])

    @property
    def any_truncated(self) -> bool:
        """Whether a chosen slot's episode was truncated."""
        return bool(self.counts[_TRUNCATED])

    @property
    def chosen(self) -> np.ndarray:
        """Positions in ``ids`` of the learner's active slots, in order."""
        return self.positions[_CHOSEN, :self.counts[_CHOSEN]]

    @property
    def theirs(self) -> np.ndarray:
        """Positions in ``ids`` of the opponents' active slots (self-play)."""
        return self.positions[_THEIRS, :self.counts[_THEIRS]]

    @property
    def ended(self) -> np.ndarray:
        """Slot ids whose episode ended on this step (active or not, any seat)."""
        return self.positions[_ENDED, :self.counts[_ENDED]]

    @property
    def reset(self) -> np.ndarray:
        """Slot ids among the chosen whose episode ended (terminated or truncated): their recurrent state resets."""
        return self.positions[_RESET, :self.counts[_RESET]]

    @property
    def truncated_at(self) -> np.ndarray:
        """Positions in ``chosen`` of the truncated slots (their final observation gets a bootstrap value)."""
        return self.positions[_TRUNCATED, :self.counts[_TRUNCATED]]


class StepBatch:
    """Reused arrays for a batch of at most ``capacity`` slots, and the compiled pass that fills them."""

    def __init__(self, capacity: int, slots_per_group: int, learner_slots: np.ndarray | None = None, *,
                 outputs: Mapping[str, np.ndarray]) -> None:
        """``learner_slots``: [total_slots] bool, the learner's seats (self-play), None when every seat is.
        ``outputs``: where ``obs`` ([>= capacity, *obs_shape]), ``action_masks`` (absent: the env has none) and,
        if given, ``rewards``, ``dones`` and ``bootstrap`` go (the row assembler's staged inputs, so the scan
        writes them where the policy and the assembler read them); arrays of this batch's own for those not given."""
        self.learner = (np.zeros(0, dtype=np.bool_) if learner_slots is None
                        else np.ascontiguousarray(learner_slots, dtype=np.bool_))
        self.slots_per_group = slots_per_group
        self._starts = np.empty(max(1, capacity // slots_per_group), dtype=np.int64)
        self._ids = np.empty(capacity, dtype=np.int64)
        self._agent_ids = np.empty(capacity, dtype=np.int64)
        self._positions = np.empty((5, capacity), dtype=np.int64)
        self._counts = np.zeros(5, dtype=np.int64)
        self.rewards = _output(outputs, "rewards", capacity, np.float32)
        """[capacity] float32: the chosen slots' rewards, in order."""
        self.dones = _output(outputs, "dones", capacity, np.uint8)
        """[capacity] uint8: 1 where the chosen slot's episode ended (terminated or truncated)."""
        self.bootstrap = _output(outputs, "bootstrap", capacity, np.float32)
        """[capacity] float32 bootstrap values, written by the stepper (zero but where truncated)."""
        self.obs = _rows_of_bytes(outputs["obs"], "obs", capacity)
        """[capacity, bytes] uint8 view of the chosen slots' observations, in order."""
        masks = outputs.get("action_masks")
        self.masks = (np.zeros((capacity, 0), dtype=np.uint8) if masks is None
                      else _rows_of_bytes(masks, "action_masks", capacity))
        """[capacity, bytes] uint8 view of the chosen slots' action masks (width 0: the env has none)."""

    def scan(self, groups: Sequence[GroupView]) -> ScannedBatch:
        """The batch of ``groups`` (each at most once) as their host's StepBuffers hold it now."""
        n = len(groups) * self.slots_per_group
        if n > len(self._ids):
            raise ValueError(f"a batch of {n} slots exceeds this StepBatch's {len(self._ids)}")
        slots = groups[0].slots
        obs_in, masks_in = _bytes_of(slots.obs), _bytes_of(slots.action_mask)  # per call: none outlives the segment
        if obs_in.shape[1] != self.obs.shape[1] or masks_in.shape[1] != self.masks.shape[1]:
            raise ValueError(f"the slots' observations ({obs_in.shape[1]} bytes) and masks ({masks_in.shape[1]}) do "
                             f"not match this StepBatch's ({self.obs.shape[1]}, {self.masks.shape[1]})")
        starts = self._starts[:len(groups)]
        for k, view in enumerate(groups):
            starts[k] = view.first_slot
        counts = self._counts
        _scan(starts, self.slots_per_group, slots.active, self.learner, slots.terminated, slots.truncated,
              slots.episode_done, slots.rewards, obs_in, masks_in, self._ids, self._agent_ids, self._positions,
              counts, self.obs, self.masks, self.rewards, self.dones)
        return ScannedBatch(ids=self._ids[:n], agent_ids=self._agent_ids[:counts[_CHOSEN]],
                            positions=self._positions, counts=counts)


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """[len(array), bytes per row] uint8 view of the rows of ``array`` (a copy if it is not contiguous)."""
    return array.reshape(len(array), math.prod(array.shape[1:])).view(np.uint8)


def _rows_of_bytes(array: np.ndarray, name: str, rows: int) -> np.ndarray:
    """[rows, bytes per row] uint8 view of the C-contiguous ``array``'s first ``rows`` rows."""
    if not array.flags.c_contiguous or len(array) < rows:
        raise ValueError(f"{name}: {array.dtype}{list(array.shape)}, expected a contiguous array of >= {rows} rows")
    return _bytes_of(array[:rows])


def _output(outputs: Mapping[str, np.ndarray], name: str, capacity: int, dtype: type) -> np.ndarray:
    """``outputs[name]`` checked to be a C-contiguous [>= capacity] array of ``dtype``, or a new zeroed one."""
    array = outputs.get(name)
    if array is None:
        return np.zeros(capacity, dtype=dtype)
    if array.dtype != dtype or array.ndim != 1 or len(array) < capacity or not array.flags.c_contiguous:
        raise ValueError(f"{name} output: {array.dtype}{list(array.shape)}, expected a contiguous "
                         f"{np.dtype(dtype)}[>= {capacity}]")
    return array
