"""The native vectorised environment contract every env in Sluice implements.

An env owns ``num_envs`` environments of ``num_agents`` agents each, so ``num_envs * num_agents`` agent
slots. It never allocates its outputs: the caller hands it a ``StepBuffers`` whose arrays are views into
shared memory, and ``reset``/``step`` write straight into them. Episodes auto-reset inside ``step``.

An env with ``state_size > 0`` (a global state, for centralised critics such as COMA's) writes
``global_state`` in reset and step, and ``final_global_state`` for every env whose episode ended on the step;
both are per slot, every agent slot of an env holding its env's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from envs.spaces import ActionSpace
from envs.errors import EnvConfigError


TOKEN_COLUMNS = 3
"""Columns of one token row: location, feature id, value."""

IMAGE_LAYOUTS = ("", "chw", "hwc")
"""Values of ``EnvSpec.image_layout``: not an image or grid, channels first [C, H, W], channels last [H, W, C]."""


@dataclass(frozen=True, kw_only=True)
class TokenLayout:
    """How an env's observation is a padded list of sparse entries: obs [L, 3] rows of (location, feature id, value)."""

    num_locations: int
    """Distinct locations (a real row's location is in [0, num_locations))."""
    num_features: int
    """Distinct feature ids (a real row's feature id is in [0, num_features))."""
    pad_value: int
    """Location that marks a padding row (outside [0, num_locations)); a padding row's other columns are ignored."""

    def __post_init__(self) -> None:
        for name in ("num_locations", "num_features", "pad_value"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise EnvConfigError(f"TokenLayout.{name} must be an int, got {value!r}")
        if self.num_locations < 1 or self.num_features < 1:
            raise EnvConfigError(f"TokenLayout.num_locations and num_features must be >= 1, got "
                                 f"{self.num_locations} and {self.num_features}")
        if 0 <= self.pad_value < self.num_locations:
            raise EnvConfigError(f"TokenLayout.pad_value {self.pad_value} is a real location; it must be outside "
                                 f"[0, {self.num_locations}) (e.g. {self.num_locations} or 255)")

    def check_obs(self, obs_shape: tuple[int, ...], obs_dtype: str) -> None:
        """EnvConfigError unless observations of this shape and dtype can hold the layout's rows."""
        if len(obs_shape) != 2 or obs_shape[1] != TOKEN_COLUMNS or obs_shape[0] < 1:
            raise EnvConfigError(f"token observations must have shape [L, {TOKEN_COLUMNS}] (rows of location, "
                                 f"feature id, value; L >= 1), got obs_shape {obs_shape}")
        dtype = np.dtype(obs_dtype)
        if dtype.kind not in "iu":
            raise EnvConfigError(f"token observations must have an integer obs_dtype, got {obs_dtype!r}")
        info = np.iinfo(dtype)
        largest = max(self.num_locations, self.num_features) - 1
        if not info.min <= self.pad_value <= info.max or largest > info.max:
            raise EnvConfigError(f"obs_dtype {obs_dtype!r} holds [{info.min}, {info.max}]: too narrow for "
                                 f"pad_value {self.pad_value}, num_locations {self.num_locations} and "
                                 f"num_features {self.num_features}")


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """What an env declares up front; carried unchanged through actors, wire and learner."""

    num_agents: int
    """Agents (agent slots) per environment."""
    obs_shape: tuple[int, ...]
    """Shape of one agent's observation."""
    obs_dtype: str
    """NumPy dtype name of observations (kept end to end: uint8 stays uint8)."""
    action: ActionSpace
    """One agent's action space (discrete, multi_discrete or box)."""
    action_mask: bool = False
    """Whether the env writes legal-action masks (discrete kinds only)."""
    episode_stats: tuple[str, ...] = ()
    """Names of extra per-episode statistics the env reports at episode end (beyond return and length)."""
    state_size: int = 0
    """Length of the env's global state (float32) that it writes for centralised critics (0: it has none)."""
    tokens: TokenLayout | None = None
    """Observations are a padded list of (location, feature id, value) rows in this layout (None: they are not)."""
    image_layout: str = ""
    """Observations are an image or grid laid out chw ([C, H, W]) or hwc ([H, W, C]); "": they are not."""

    def __post_init__(self) -> None:
        if self.image_layout not in IMAGE_LAYOUTS:
            raise EnvConfigError(f"EnvSpec.image_layout must be one of 'chw', 'hwc' or '' (not an image), "
                                 f"got {self.image_layout!r}")
        if self.image_layout and len(self.obs_shape) != 3:
            raise EnvConfigError(f"EnvSpec.image_layout {self.image_layout!r} needs a rank-3 obs_shape, "
                                 f"got {self.obs_shape}")
        if self.tokens is not None:
            if not isinstance(self.tokens, TokenLayout):
                raise EnvConfigError(f"EnvSpec.tokens must be an envs.base.TokenLayout or None, got "
                                     f"{type(self.tokens).__name__}")
            self.tokens.check_obs(self.obs_shape, self.obs_dtype)
        if isinstance(self.state_size, bool) or not isinstance(self.state_size, int) or self.state_size < 0:
            raise EnvConfigError(f"EnvSpec.state_size must be an int >= 0 (0: no global state), "
                                 f"got {self.state_size!r}")
        if self.action_mask and self.action.kind == "box":
            raise EnvConfigError("action masks need a discrete or multi_discrete action space, not box")
        if np.dtype(self.obs_dtype).name != self.obs_dtype:
            raise EnvConfigError(f"obs_dtype must be a NumPy dtype name, got {self.obs_dtype!r}")

    @property
    def num_actions(self) -> int:
        """Choices of a discrete action space (ValueError for the other kinds)."""
        return self.action.num_actions

    @property
    def mask_size(self) -> int:
        """uint8 flags of one agent's action mask (0 when the env has none)."""
        return self.action.num_logits if self.action_mask else 0


@dataclass(frozen=True, kw_only=True)
class StepBuffers:
    """Per-agent-slot arrays an env reads actions from and writes results into (length A = agent slots).

    Slots whose ``active`` flag is 0 after a call carry no step: the host neither acts for them nor records
    them. An env that has a reward or an episode end for such a slot holds it back and writes it on the
    slot's next active step (together with the first observation of the slot's next episode), so every
    recorded step is a real one and ``terminated``/``truncated`` always arrive with a new episode's first obs.

    An env with ``spec.state_size > 0`` writes ``global_state`` in reset and step, and ``final_global_state``
    for every env whose episode ended on the step (in all of that env's slots); both have width 0 otherwise.
    """

    obs: np.ndarray
    """[A, *obs_shape] observation after the step (the first obs of the next episode after an auto-reset)."""
    actions: np.ndarray
    """[A, *action.shape] actions to apply (input; int32 for the discrete kinds, float32 for box)."""
    rewards: np.ndarray
    """[A] float32 reward of the transition just taken."""
    terminated: np.ndarray
    """[A] bool: the episode reached a terminal state on this step."""
    truncated: np.ndarray
    """[A] bool: the episode was cut by a time limit on this step (and did not terminate)."""
    final_obs: np.ndarray
    """[A, *obs_shape] the last observation of an episode that was truncated on this step."""
    episode_done: np.ndarray
    """[A] bool: an episode ended on this step; episode_return/length/stats are valid there."""
    episode_return: np.ndarray
    """[A] float32 undiscounted return of the episode that ended."""
    episode_length: np.ndarray
    """[A] int32 length in steps of the episode that ended."""
    episode_stats: np.ndarray
    """[A, len(spec.episode_stats)] float32 named statistics of the episode that ended."""
    action_mask: np.ndarray
    """[A, spec.mask_size] uint8 legal actions for the next step (1 = legal); width 0 without masks."""
    active: np.ndarray
    """[A] bool: the slot holds an agent that acts on this step (set to True by a reset)."""
    global_state: np.ndarray
    """[A, spec.state_size] float32 global state of the slot's env after the call (the new episode's first
    state after an auto-reset); every slot of an env holds the same row."""
    final_global_state: np.ndarray
    """[A, spec.state_size] float32 last global state of an episode that ended (terminated or truncated) on
    this step, in the slots of that env; valid where terminated | truncated."""

    def clear_step_outputs(self) -> None:
        """What a reset leaves behind: rewards, flags, final observations, final global states and stats
        zeroed, every slot active, every action legal."""
        for array in (self.rewards, self.terminated, self.truncated, self.final_obs, self.episode_done,
                      self.episode_return, self.episode_length, self.episode_stats, self.final_global_state):
            array[:] = 0
        self.active[:] = True
        self.action_mask[:] = 1

    @staticmethod
    def allocate(spec: EnvSpec, num_envs: int) -> "StepBuffers":
        """Private (non-shared) buffers, for tests and single-process use."""
        arrays = {name: np.zeros(shape, dtype=dtype)
                  for name, shape, dtype in step_buffer_fields(spec, num_envs * spec.num_agents)}
        arrays["active"][:] = True
        return StepBuffers(**arrays)


def step_buffer_fields(spec: EnvSpec, slots: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every StepBuffers array for ``slots`` agent slots (the shared-memory layout)."""
    obs = (slots, *spec.obs_shape)
    return [
        ("obs", obs, spec.obs_dtype), ("actions", (slots, *spec.action.shape), spec.action.dtype),
        ("rewards", (slots,), "float32"), ("terminated", (slots,), "bool"), ("truncated", (slots,), "bool"),
        ("final_obs", obs, spec.obs_dtype), ("episode_done", (slots,), "bool"),
        ("episode_return", (slots,), "float32"), ("episode_length", (slots,), "int32"),
        ("episode_stats", (slots, len(spec.episode_stats)), "float32"),
        ("action_mask", (slots, spec.mask_size), "uint8"), ("active", (slots,), "bool"),
        ("global_state", (slots, spec.state_size), "float32"),
        ("final_global_state", (slots, spec.state_size), "float32"),
    ]


class VecEnv(Protocol):
    """A batch of environments stepped together into caller-owned buffers."""

    spec: EnvSpec
    num_envs: int

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset every env; write first observations (and masks); ``buffers.clear_step_outputs()`` the rest."""

    def step(self, buffers: StepBuffers) -> None:
        """Apply ``buffers.actions``; write results; auto-reset the envs whose episode ended."""

    def close(self) -> None:
        """Release resources."""
