"""The native vectorised environment contract every env in Sluice implements.

An env owns ``num_envs`` environments of ``num_agents`` agents each, so ``num_envs * num_agents`` agent
slots. It never allocates its outputs: the caller hands it a ``StepBuffers`` whose arrays are views into
shared memory, and ``reset``/``step`` write straight into them. Episodes auto-reset inside ``step``.

An env with ``state_size > 0`` (a global state, for centralised critics such as COMA's) writes
``global_state`` in reset and step, and ``final_global_state`` for every env whose episode ended on the step;
both are per slot, every agent slot of an env holding its env's values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from envs.spaces import ActionSpace
from envs.errors import EnvConfigError


TOKEN_COLUMNS = 3
"""Columns of one token row: location, feature id, value."""

IMAGE_LAYOUTS = ("", "chw", "hwc")
"""Values of ``EnvSpec.image_layout``: not an image or grid, channels first [C, H, W], channels last [H, W, C]."""
OBS_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
"""The observation dtypes carried end to end (shared memory, the host's compiled row assembler, the wire, the learner's
batch); not float16, which the compiled assembler has no type for (the adapters carry a float16 space as float32)."""


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


LEAF_KINDS = ("box", "discrete", "multi_discrete", "multi_binary")
"""Values of ``ObsLeaf.kind``: the Gymnasium leaf spaces a structured observation may hold."""
FLAT_DTYPES = ("uint8", "float32")
"""The dtypes of a structured observation's flat buffer (``envs.obs_layout.flat_dtype`` picks one)."""
FLOAT32_EXACT = 2 ** 24
"""Integers of magnitude up to this are exact in float32 (the flat buffer of a structured observation)."""


@dataclass(frozen=True, kw_only=True)
class ObsLeaf:
    """One leaf of a structured (Dict / Tuple) observation and where its values lie in the flat observation.

    The flat observation is ``EnvSpec.obs_shape == (N,)`` values of ``EnvSpec.obs_dtype``; the leaf's values,
    flattened in C order, are ``flat[offset:offset + size]`` (discrete kinds as ``value - start``).
    ``envs.obs_layout`` lays leaves out, flattens observations into the buffer and reads them back.
    """

    path: tuple[str | int, ...]
    """Keys from the top of the observation to the leaf: a Dict key (str) or a Tuple index (int) per level."""
    kind: str
    """box, discrete, multi_discrete or multi_binary (``LEAF_KINDS``)."""
    shape: tuple[int, ...] = ()
    """The leaf's own shape (() for discrete, nvec's shape for multi_discrete)."""
    dtype: str = "int64"
    """NumPy dtype name of the leaf's values as the env gives them (read back in this dtype)."""
    offset: int = 0
    """Index of the leaf's first value in the flat observation."""
    nvec: tuple[int, ...] = ()
    """Values per component of a discrete kind: (n,) for discrete, nvec flattened for multi_discrete; () else."""
    start: tuple[int, ...] = ()
    """Smallest value per component of a discrete kind (Gymnasium's start; () means all 0); the flat buffer holds
    ``value - start``."""
    tokens: TokenLayout | None = None
    """A box leaf that is a padded token list ([L, 3] integer rows) in this layout; None: it is not."""
    image_layout: str = ""
    """A rank-3 box leaf that is an image or grid: chw or hwc; "": it is not."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "path", tuple(self.path))
        if self.kind not in LEAF_KINDS:
            raise EnvConfigError(f"observation leaf {self.name!r}: kind {self.kind!r} is not one of {LEAF_KINDS}")
        if self.kind == "discrete" and self.shape != ():
            raise EnvConfigError(f"observation leaf {self.name!r}: a discrete leaf has shape (), got {self.shape}")
        if self.kind in ("discrete", "multi_discrete"):
            if len(self.nvec) != self.size or min(self.nvec, default=1) < 1:
                raise EnvConfigError(f"observation leaf {self.name!r}: nvec must hold {self.size} counts >= 1 "
                                     f"(one per value), got {self.nvec}")
            if not self.start:
                object.__setattr__(self, "start", (0,) * self.size)
            if len(self.start) != self.size:
                raise EnvConfigError(f"observation leaf {self.name!r}: start must hold {self.size} values, got "
                                     f"{self.start}")
        elif self.nvec or self.start:
            raise EnvConfigError(f"observation leaf {self.name!r}: nvec and start are for discrete kinds, not "
                                 f"{self.kind}")
        if self.image_layout not in IMAGE_LAYOUTS or (self.image_layout and (self.kind != "box"
                                                                             or len(self.shape) != 3)):
            raise EnvConfigError(f"observation leaf {self.name!r}: image_layout {self.image_layout!r} needs a "
                                 f"rank-3 box leaf and one of 'chw', 'hwc', '' (got kind {self.kind}, shape "
                                 f"{self.shape})")
        if self.tokens is not None:
            if self.kind != "box":
                raise EnvConfigError(f"observation leaf {self.name!r}: a token layout needs a box leaf, not "
                                     f"{self.kind}")
            self.tokens.check_obs(self.shape, self.dtype)
        if self.offset < 0:
            raise EnvConfigError(f"observation leaf {self.name!r}: offset must be >= 0, got {self.offset}")

    @property
    def name(self) -> str:
        """The path joined by '.', e.g. 'image' or '0.pos' ('' for an observation that is one leaf)."""
        return ".".join(str(part) for part in self.path)

    @property
    def size(self) -> int:
        """Values the leaf takes in the flat observation."""
        return math.prod(self.shape)

    def fits_uint8(self) -> bool:
        """Whether every value of the leaf is exact in a uint8 flat buffer."""
        if self.kind == "box":
            return np.dtype(self.dtype) in (np.uint8, np.bool_)
        return self.kind == "multi_binary" or max(self.nvec) <= 256


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
    obs_leaves: tuple[ObsLeaf, ...] = ()
    """A structured (Dict / Tuple) observation carried flat: its leaves, each a slice of the flat obs [N] of
    obs_dtype uint8 or float32 (``envs.obs_layout``); (): the observation is one array of obs_shape."""

    def __post_init__(self) -> None:
        if self.obs_leaves:
            self._check_leaves()
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
        if self.obs_dtype not in OBS_DTYPES:
            raise EnvConfigError(f"obs_dtype {self.obs_dtype!r} cannot be carried; one of {', '.join(OBS_DTYPES)} "
                                 f"(write float16 observations as float32)")

    def _check_leaves(self) -> None:
        """EnvConfigError unless the leaves fit, without overlap, in a flat obs of a dtype that holds them exactly."""
        if len(self.obs_shape) != 1 or self.obs_dtype not in FLAT_DTYPES or self.tokens or self.image_layout:
            raise EnvConfigError(f"EnvSpec.obs_leaves needs a flat obs_shape (N,) of obs_dtype uint8 or float32 and "
                                 f"the token and image layouts on the leaves; got obs_shape {self.obs_shape}, "
                                 f"obs_dtype {self.obs_dtype!r}, tokens {self.tokens}, image_layout "
                                 f"{self.image_layout!r} (envs.obs_layout.structured_obs lays leaves out)")
        end = 0
        for leaf in sorted(self.obs_leaves, key=lambda leaf: leaf.offset):
            if not isinstance(leaf, ObsLeaf):
                raise EnvConfigError(f"EnvSpec.obs_leaves must hold envs.base.ObsLeaf, got {type(leaf).__name__}")
            if leaf.offset < end or leaf.offset + leaf.size > self.obs_shape[0]:
                raise EnvConfigError(f"observation leaf {leaf.name!r} at [{leaf.offset}, {leaf.offset + leaf.size}) "
                                     f"overlaps another leaf or lies outside the flat obs of {self.obs_shape[0]}")
            end = leaf.offset + leaf.size
            if self.obs_dtype == "uint8" and not leaf.fits_uint8():
                raise EnvConfigError(f"observation leaf {leaf.name!r} ({leaf.kind} {leaf.dtype}) is not exact in a "
                                     f"uint8 flat obs; use obs_dtype float32")
            if max(leaf.nvec, default=0) > FLOAT32_EXACT:
                raise EnvConfigError(f"observation leaf {leaf.name!r} has {max(leaf.nvec)} values, more than "
                                     f"float32 holds exactly (2**24)")
        names = [leaf.name for leaf in self.obs_leaves]
        if len(set(names)) != len(names):
            raise EnvConfigError(f"EnvSpec.obs_leaves has repeated leaf names: {names}")

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

    def part(self, slots: slice) -> "StepBuffers":
        """The same buffers restricted to ``slots`` (views: writes go to these arrays)."""
        return StepBuffers(**{name: getattr(self, name)[slots] for name in self.__dataclass_fields__})

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
