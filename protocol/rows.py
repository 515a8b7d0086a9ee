"""The layout of a row, in one table: the actor's assembler, the ROWS message and the learner's batch follow it.

A row is ``horizon = bptt_horizon + 1`` consecutive steps of one agent. Per-step fields are
[rows, horizon, *shape]; per-row fields [rows, *shape], taken when the row's first step is written.

What one step's fields hold:

* ``obs``, ``actions``, ``action_masks``, ``logprobs``, ``values``: the agent's observation, the action sampled
  for it, the legal-action flags it was sampled under (width 0: the env has no masks), its behaviour
  log-probability and the value estimate of that observation.
* ``rewards``, ``dones``, ``bootstrap``: what ARRIVED WITH this observation, i.e. the result of the previous
  transition (``bootstrap``: the value of the final obs of a truncated episode, 0 elsewhere). The learner's
  GAE therefore uses ``rewards[t + 1]``, ``dones[t + 1]`` and ``bootstrap[t + 1]`` for the transition out of
  step ``t``.
* ``versions[row]``: the policy version that produced the row's FIRST step.
* ``states[row]``: the recurrent state the agent's policy had before its forward pass on the row's FIRST step
  (width 0 for feed-forward policies), so the learner can replay the row from the same state.

Team rows (COMA, ``RowLayout.team_size = N > 0``): a row is one ENV's steps, every agent of it together, so the
learner sees joint transitions. Then ``obs`` is [N, *obs_shape], ``actions`` [N, *action_shape] (for COMA's
tanh-Gaussian policies: the pre-tanh draws ``u``; the env's actions are their squash), ``logprobs`` and ``rewards``
[N] (each agent's own), ``dones`` the env's episode end, and four fields that are width 0 in per-agent rows hold:

* ``global_state``: the env's global state at this step (``EnvSpec.state_size`` floats);
* ``truncated``: 1 where the episode that ended on the transition into this step was cut by a time limit (it
  bootstraps from its final state), 0 where it terminated or did not end;
* ``final_obs``, ``final_global_state``: where an episode ended on the transition into this step, its last
  observations and state (the step's own ``obs`` and ``global_state`` are the next episode's first).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from protocol.validation import ArraySpec

NAN = float("nan")


@dataclass(frozen=True, kw_only=True)
class RowField:
    """One array of a row. ``shape`` and ``dtype`` may name a :class:`RowLayout` attribute (the env's sizes)."""

    name: str
    """The array's name in a ROWS message, in the actor's assembler and in the learner's batch."""
    per_step: bool
    """True: one value per step, [rows, horizon, *shape]; False: one per row, [rows, *shape]."""
    shape: tuple[int | str, ...]
    """Trailing dimensions: sizes, or names of RowLayout attributes (a tuple-valued one is spliced in)."""
    dtype: str
    """The wire dtype, or the name of the RowLayout attribute that holds it."""
    poison: float
    """What fresh buffers hold so an unwritten value stands out: always NaN when the dtype is float, else
    this value cast to the dtype (0xA5, or -1 for fields where nothing valid is negative)."""
    finite: bool
    """Receivers reject NaN and inf in this field."""
    bounded: bool
    """Receivers reject values of this field, when its dtype is float, that are NaN, inf or larger in magnitude
    than network.max_abs_value (an absurd value would make every gradient step of an update non-finite)."""
    flag: bool
    """Receivers reject values other than 0 and 1 in this field."""


ROW_FIELDS: tuple[RowField, ...] = (
    RowField(name="obs", per_step=True, shape=("obs_shape",), dtype="obs_dtype", poison=0xA5,
             finite=False, bounded=True, flag=False),
    RowField(name="actions", per_step=True, shape=("action_shape",), dtype="action_dtype", poison=-1,
             finite=True, bounded=True, flag=False),
    RowField(name="action_masks", per_step=True, shape=("mask_size",), dtype="uint8", poison=0xA5,
             finite=False, bounded=False, flag=True),
    RowField(name="logprobs", per_step=True, shape=("agent_dims",), dtype="float32", poison=NAN,
             finite=True, bounded=True, flag=False),
    RowField(name="values", per_step=True, shape=(), dtype="float32", poison=NAN,
             finite=True, bounded=True, flag=False),
    RowField(name="rewards", per_step=True, shape=("agent_dims",), dtype="float32", poison=NAN,
             finite=True, bounded=True, flag=False),
    RowField(name="dones", per_step=True, shape=(), dtype="uint8", poison=0xFF, finite=False, bounded=False, flag=True),
    RowField(name="bootstrap", per_step=True, shape=(), dtype="float32", poison=NAN,
             finite=True, bounded=True, flag=False),
    RowField(name="versions", per_step=False, shape=(), dtype="int64", poison=-1,
             finite=False, bounded=False, flag=False),
    RowField(name="states", per_step=False, shape=("state_size",), dtype="float32", poison=NAN,
             finite=False, bounded=True, flag=False),
    RowField(name="global_state", per_step=True, shape=("global_state_size",), dtype="float32", poison=NAN,
             finite=True, bounded=True, flag=False),
    RowField(name="truncated", per_step=True, shape=("team_flag",), dtype="uint8", poison=0xFF,
             finite=False, bounded=False, flag=True),
    RowField(name="final_obs", per_step=True, shape=("final_obs_shape",), dtype="obs_dtype", poison=0xA5,
             finite=False, bounded=True, flag=False),
    RowField(name="final_global_state", per_step=True, shape=("global_state_size",), dtype="float32", poison=NAN,
             finite=True, bounded=True, flag=False),
)
"""Every array of a row, in ROWS message order. Adding a field here adds it to the assembler's buffers, the
ROWS message and its validation, and the learner's host buffers; its producer (the actor's ``add`` call) and
its consumers (the learner's RowBatch, and Minibatch when the losses read it) then name it."""

ROW_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in ROW_FIELDS)
"""The names of ROW_FIELDS, in order."""

STEP_COUNTS: tuple[str, ...] = ("env_steps", "agent_steps", "env_restarts")
"""The counts a ROWS message carries as top-level fields: the actor host's env steps (one env, all its agents, one
step), agent steps (steps of active agents: what total_timesteps counts) and env groups rebuilt after raising, since
its last message. Each an integer >= 0 (``learner/serve/row_checks.py`` bounds them)."""

HOST_STATS: tuple[str, ...] = ("inference_batches", "inference_agents", "inference_s", "act_s", "worker_wait_s",
                               "worker_step_s")
"""Keys of a ROWS message's optional ``host_stats`` map: the actor host's counters since its last message
(forward passes, agents decided for, seconds in the policy, seconds in the whole inference step, seconds its
env workers waited for actions and spent stepping). Each a finite number >= 0."""


@dataclass(frozen=True, kw_only=True)
class RowLayout:
    """The sizes and dtypes a row's arrays depend on: the horizon, the env's spaces and the policy's state."""

    horizon: int
    """Steps per row (bptt_horizon + 1)."""
    obs_shape: tuple[int, ...]
    """One observation's shape."""
    obs_dtype: str
    """The observations' dtype (the env's, kept on the wire)."""
    action_shape: tuple[int, ...] = ()
    """One action's shape (() for a single discrete choice)."""
    action_dtype: str = "int32"
    """The actions' dtype: int32 for the discrete kinds, float32 for box."""
    action_nvec: tuple[int, ...] = ()
    """Choices per component of a discrete kind's action (() for box, or where the range is not needed)."""
    mask_size: int = 0
    """Width of an action mask (0: the env has no masks)."""
    state_size: int = 0
    """Width of the policy's recurrent state (0: feed-forward)."""
    team_size: int = 0
    """Agents per team row (COMA's joint rows: obs_shape and action_shape then lead with it); 0: one agent per row."""
    global_state_size: int = 0
    """Width of a team row's global state (0 in per-agent rows)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "obs_shape", tuple(int(d) for d in self.obs_shape))
        object.__setattr__(self, "action_shape", tuple(int(d) for d in self.action_shape))
        object.__setattr__(self, "action_nvec", tuple(int(n) for n in self.action_nvec))
        object.__setattr__(self, "obs_dtype", np.dtype(self.obs_dtype).name)
        object.__setattr__(self, "action_dtype", np.dtype(self.action_dtype).name)
        if self.team_size < 0 or (self.team_size == 0 and self.global_state_size):
            raise ValueError(f"RowLayout: team_size {self.team_size} must be >= 0, and global_state_size "
                             f"{self.global_state_size} is only for team rows (team_size > 0)")

    @property
    def agent_dims(self) -> tuple[int, ...]:
        """The per-agent dimension of logprobs and rewards: (team_size,) in team rows, () otherwise."""
        return (self.team_size,) if self.team_size else ()

    @property
    def team_flag(self) -> tuple[int, ...]:
        """The shape of a team row's per-step flag (one value), width 0 in per-agent rows."""
        return () if self.team_size else (0,)

    @property
    def final_obs_shape(self) -> tuple[int, ...]:
        """The shape of a team row's final observations (obs_shape), width 0 in per-agent rows."""
        return self.obs_shape if self.team_size else (0,)

    def value_shape(self, field: RowField) -> tuple[int, ...]:
        """The shape of one value of ``field`` (one step's, or one row's for a per-row field)."""
        dims: list[int] = []
        for dim in field.shape:
            value = getattr(self, dim) if isinstance(dim, str) else dim
            dims.extend(value if isinstance(value, tuple) else (int(value),))
        return tuple(dims)

    def row_shape(self, field: RowField) -> tuple[int, ...]:
        """The shape of ``field`` in one row: [horizon, *value_shape] per step, value_shape per row."""
        value = self.value_shape(field)
        return (self.horizon, *value) if field.per_step else value

    def dtype(self, field: RowField) -> np.dtype:
        """The dtype of ``field``."""
        own = {f.name for f in fields(self)}
        return np.dtype(getattr(self, field.dtype) if field.dtype in own else field.dtype)

    def row_nbytes(self) -> int:
        """The bytes one row takes in a ROWS message's arrays (every field, headers aside)."""
        return sum(int(np.prod(self.row_shape(f), dtype=np.int64)) * self.dtype(f).itemsize for f in ROW_FIELDS)

    def specs(self) -> dict[str, ArraySpec]:
        """The array specs of a ROWS message, in message order."""
        return {f.name: ArraySpec(dtype=self.dtype(f).name, shape=(-1, *self.row_shape(f)),
                                  allow_nonfinite=not f.finite) for f in ROW_FIELDS}

    def allocate(self, rows: int) -> dict[str, np.ndarray]:
        """Buffers for ``rows`` rows of every field, holding the fields' poison values."""
        return {f.name: np.full((rows, *self.row_shape(f)), self.poison(f), dtype=self.dtype(f)) for f in ROW_FIELDS}

    def poison(self, field: RowField) -> np.generic:
        """The value ``field``'s buffers hold until written, in the field's dtype (NaN for floats)."""
        dtype = self.dtype(field)
        return dtype.type(np.nan) if dtype.kind == "f" else np.array(int(field.poison)).astype(dtype)[()]
