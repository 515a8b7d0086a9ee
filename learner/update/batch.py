"""A batch of rows in the learner, as the table of row fields (``protocol.rows.ROW_FIELDS``) lays it out.

``BatchBuffers`` is the host copy the ingest thread fills, one array per field; ``to_batch`` moves it to the
training device as a ``RowBatch``, whose fields are the table's; ``minibatch_rows`` cuts a RowBatch into what
every ``learner.ppo.losses.Minibatch`` takes from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from protocol.rows import ROW_FIELDS, RowLayout
from protocol.validation import out_of_range_index

LEARNER_FLOAT = frozenset({"dones"})
"""Row fields the learner reads as float32 (they multiply returns and recurrent states); int32 fields (the
discrete kinds' actions) become int64, the dtype torch indexes with; every other field keeps its wire dtype."""

TEAM_FIELDS = frozenset({"global_state", "truncated", "final_obs", "final_global_state"})
"""Row fields only team rows (COMA) fill; width 0 in PPO's per-agent rows."""

NOT_IN_MINIBATCH = frozenset({"rewards", "bootstrap", "versions"}) | TEAM_FIELDS
"""Row fields PPO's update reads before it samples minibatches (they reach the losses as advantages and returns),
and the team fields it never reads."""

MINIBATCH_NAMES = {"logprobs": "old_logprobs", "values": "old_values"}
"""Row fields a Minibatch carries under another name (CleanRL's); the others keep the table's names."""

MINIBATCH_DERIVED = ("advantages", "returns", "is_weights")
"""Minibatch fields the update computes rather than takes from the rows."""


@dataclass(frozen=True, kw_only=True)
class BatchBuffers:
    """One batch of rows in host memory: every row field, [segments, horizon, ...] or [segments, ...]."""

    arrays: dict[str, np.ndarray]
    """Field name -> array, in ROW_FIELDS order and wire dtypes."""
    action_nvec: tuple[int, ...] = ()
    """Choices per component of the discrete actions (() for box): ``to_batch`` refuses any action outside."""
    pinned: bool = False
    """The arrays live in page-locked (CUDA pinned) host memory: ``to_batch`` copies them to the GPU asynchronously."""

    @classmethod
    def allocate(cls, layout: RowLayout, segments: int, *, pinned: bool = False) -> BatchBuffers:
        """Buffers for ``segments`` rows, holding each field's poison value until filled (every row of a
        batch is written before the trainer reads it, so an unfilled value shows up as NaN or a marker);
        ``pinned``: in page-locked memory (needs CUDA), for a learner that trains on a GPU."""
        arrays = layout.allocate(segments)
        if pinned:  # a pinned copy of each poisoned array; the numpy view keeps its tensor alive
            arrays = {name: torch.from_numpy(array).pin_memory().numpy() for name, array in arrays.items()}
        return cls(arrays=arrays, action_nvec=layout.action_nvec, pinned=pinned)


@dataclass(frozen=True, kw_only=True)
class RowBatch:
    """A batch of rows on the training device, one tensor per row field; per-step tensors are [S, T+1]."""

    obs: torch.Tensor
    """[S, T+1, *obs_shape] in the env dtype."""
    actions: torch.Tensor
    """[S, T+1, *action_shape] actions taken (int64 for the discrete kinds, float32 for box)."""
    action_masks: torch.Tensor
    """[S, T+1, mask_size] uint8 legal-action flags the actor sampled under (mask_size 0: no masks)."""
    logprobs: torch.Tensor
    """[S, T+1] behaviour log-probs ([S, T+1, N] in team rows)."""
    values: torch.Tensor
    """[S, T+1] behaviour values."""
    rewards: torch.Tensor
    """[S, T+1] reward that arrived with each step ([S, T+1, N] in team rows)."""
    dones: torch.Tensor
    """[S, T+1] 1.0 where the episode ended on the transition into this step."""
    bootstrap: torch.Tensor
    """[S, T+1] value of the final obs of a truncated episode (0 elsewhere)."""
    versions: torch.Tensor
    """[S] int64 policy version that produced each row's first step."""
    states: torch.Tensor
    """[S, policy.state_size] recurrent state the actor had before its forward pass on step 0."""
    global_state: torch.Tensor
    """[S, T+1, state_size] team rows: the env's global state at each step (width 0 otherwise)."""
    truncated: torch.Tensor
    """[S, T+1] uint8 team rows: the episode that ended into this step was truncated ([S, T+1, 0] otherwise)."""
    final_obs: torch.Tensor
    """[S, T+1, N, *obs_shape] team rows: the last observations of an episode that ended into this step."""
    final_global_state: torch.Tensor
    """[S, T+1, state_size] team rows: the last global state of an episode that ended into this step."""


def to_batch(buffers: BatchBuffers, device: torch.device) -> RowBatch:
    """Host batch -> device tensors (obs keeps its env dtype; the model casts). RuntimeError for a discrete action
    outside its range: the ingest lets none through, so this is a gap in its checks, named here rather than left to
    surface as an index error inside the update.

    Pinned buffers reach a GPU by asynchronous copies, which are waited for once, at the end: the caller may hand
    the host buffers back to be refilled as soon as this returns."""
    check_action_range(buffers)
    asynchronous = buffers.pinned and device.type == "cuda"
    tensors = {}
    for field in ROW_FIELDS:
        tensor = torch.from_numpy(buffers.arrays[field.name]).to(device, non_blocking=asynchronous)
        if field.name in LEARNER_FLOAT:
            tensor = tensor.to(torch.float32)
        elif tensor.dtype == torch.int32:
            tensor = tensor.to(torch.int64)
        tensors[field.name] = tensor
    if asynchronous:  # the copies read the host buffers until they end
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(device))
        copied.synchronize()
    return RowBatch(**tensors)


def check_action_range(buffers: BatchBuffers) -> None:
    """RuntimeError naming the row, step and range of the first discrete action outside ``action_nvec``."""
    if not buffers.action_nvec:
        return
    actions = buffers.arrays["actions"]
    index = out_of_range_index(actions, buffers.action_nvec)
    if index is not None:
        raise RuntimeError(f"batch field 'actions' holds {int(actions[index])} at index {index} (row, step"
                           f"{', component' if actions.ndim > 2 else ''}), outside the action ranges "
                           f"[0, n) for nvec {list(buffers.action_nvec)}: ingest validation let it through")


def minibatch_rows(batch: RowBatch, horizon: int) -> dict[str, torch.Tensor]:
    """What minibatches take from the rows, under their Minibatch names: every row field but NOT_IN_MINIBATCH,
    per-step ones cut to the first ``horizon`` steps (the last step of a row only bootstraps)."""
    rows = {}
    for field in ROW_FIELDS:
        if field.name in NOT_IN_MINIBATCH:
            continue
        tensor = getattr(batch, field.name)
        rows[MINIBATCH_NAMES.get(field.name, field.name)] = tensor[:, :horizon] if field.per_step else tensor
    return rows
