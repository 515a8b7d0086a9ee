"""One inference step's batch, read in one compiled pass over the host's shared memory.

``StepBatch.scan`` takes the host-wide slot ids of the ready groups and, in one ``numba`` pass over the slots'
flags in shared memory (no Python per group or per slot), sorts them into: the learner's active slots (acted for
and recorded), the opponents' active slots (self-play: acted for, never recorded), the slots whose episode
ended on this step (episode statistics), the slots whose recurrent state resets, and the truncated ones (their
bootstrap value). The same pass copies each recorded slot's reward and done flag into the batch's reused arrays.
Every array is allocated once, at the host's start, for the largest batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numba
import numpy as np

from envs.base import StepBuffers


@numba.njit(cache=True)
def _scan(ids, active, learner, terminated, truncated, episode_done, rewards_in,
          chosen, theirs, ended, reset, truncated_at, rewards, dones):
    """Sort the batch's slots (see the module docstring); return the five counts. ``learner`` has length 0 when
    every slot is the learner's."""
    n_chosen = n_theirs = n_ended = n_reset = n_truncated = 0
    everyone = learner.shape[0] == 0
    for i in range(ids.shape[0]):
        s = ids[i]
        if episode_done[s]:
            ended[n_ended] = s
            n_ended += 1
        if not active[s]:
            continue
        if not everyone and not learner[s]:
            theirs[n_theirs] = i
            n_theirs += 1
            continue
        done = terminated[s] or truncated[s]
        if done:
            reset[n_reset] = s
            n_reset += 1
        if truncated[s]:
            truncated_at[n_truncated] = n_chosen
            n_truncated += 1
        chosen[n_chosen] = i
        rewards[n_chosen] = rewards_in[s]
        dones[n_chosen] = 1 if done else 0
        n_chosen += 1
    return n_chosen, n_theirs, n_ended, n_reset, n_truncated


@dataclass(slots=True, kw_only=True)
class ScannedBatch:
    """What ``StepBatch.scan`` found in one batch (views of the batch's reused arrays, valid until the next scan)."""

    ids: np.ndarray
    """[n] host-wide slot ids of the batch's groups, group after group."""
    chosen: np.ndarray
    """Positions in ``ids`` of the learner's active slots, in order (acted for and recorded)."""
    theirs: np.ndarray
    """Positions in ``ids`` of the opponents' active slots (self-play)."""
    ended: np.ndarray
    """Slot ids whose episode ended on this step (active or not, any seat)."""
    reset: np.ndarray
    """Slot ids among the chosen whose episode ended (terminated or truncated): their recurrent state resets."""
    truncated_at: np.ndarray
    """Positions in ``chosen`` of the truncated slots (their final observation gets a bootstrap value)."""
    rewards: np.ndarray
    """[len(chosen)] float32 rewards of the chosen slots."""
    dones: np.ndarray
    """[len(chosen)] uint8: 1 where the chosen slot's episode ended (terminated or truncated)."""

    @property
    def all_chosen(self) -> bool:
        """Whether every slot of the batch is chosen (then ``ids`` are the agent ids, with no copy)."""
        return len(self.chosen) == len(self.ids)


class StepBatch:
    """Reused arrays for a batch of at most ``capacity`` slots, and the compiled pass that fills them."""

    def __init__(self, capacity: int, learner_slots: np.ndarray | None = None, *,
                 outputs: Mapping[str, np.ndarray] | None = None) -> None:
        """``learner_slots``: [total_slots] bool, the learner's seats (self-play), None when every seat is.
        ``outputs``: where ``rewards``, ``dones`` and ``bootstrap`` go (the row assembler's staged inputs, so the
        scan writes them where the assembler reads them), else arrays of this batch's own."""
        self.learner = (np.zeros(0, dtype=np.bool_) if learner_slots is None
                        else np.ascontiguousarray(learner_slots, dtype=np.bool_))
        self._positions = tuple(np.empty(capacity, dtype=np.int64) for _ in range(5))
        outputs = outputs or {}
        self._rewards = _output(outputs, "rewards", capacity, np.float32)
        self._dones = _output(outputs, "dones", capacity, np.uint8)
        self.bootstrap = _output(outputs, "bootstrap", capacity, np.float32)
        """[capacity] float32 bootstrap values, written by the stepper (zero but where truncated)."""

    def scan(self, ids: np.ndarray, slots: StepBuffers) -> ScannedBatch:
        """The batch of slots ``ids`` as ``slots`` (the host's StepBuffers) holds it now."""
        if len(ids) > len(self._rewards):
            raise ValueError(f"a batch of {len(ids)} slots exceeds this StepBatch's {len(self._rewards)}")
        chosen, theirs, ended, reset, truncated_at = self._positions
        counts = _scan(ids, slots.active, self.learner, slots.terminated, slots.truncated, slots.episode_done,
                       slots.rewards, chosen, theirs, ended, reset, truncated_at, self._rewards, self._dones)
        n_chosen, n_theirs, n_ended, n_reset, n_truncated = counts
        return ScannedBatch(ids=ids, chosen=chosen[:n_chosen], theirs=theirs[:n_theirs], ended=ended[:n_ended],
                            reset=reset[:n_reset], truncated_at=truncated_at[:n_truncated],
                            rewards=self._rewards[:n_chosen], dones=self._dones[:n_chosen])


def _output(outputs: Mapping[str, np.ndarray], name: str, capacity: int, dtype: type) -> np.ndarray:
    """``outputs[name]`` checked to be a C-contiguous [>= capacity] array of ``dtype``, or a new zeroed one."""
    array = outputs.get(name)
    if array is None:
        return np.zeros(capacity, dtype=dtype)
    if array.dtype != dtype or array.ndim != 1 or len(array) < capacity or not array.flags.c_contiguous:
        raise ValueError(f"{name} output: {array.dtype}{list(array.shape)}, expected a contiguous "
                         f"{np.dtype(dtype)}[>= {capacity}]")
    return array
