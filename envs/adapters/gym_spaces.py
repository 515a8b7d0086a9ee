"""Gymnasium spaces <-> Sluice's EnvSpec, shared by the Gymnasium, Gymnasium-vector and PettingZoo adapters.

What maps onto what (one agent's spaces):

* observation ``Box`` (any shape, any number dtype) -> ``obs_shape``/``obs_dtype`` unchanged (uint8 stays uint8;
  float16 is carried as float32, which the compiled row assembler has a type for); a rank-3 Box is declared an
  image (``EnvSpec.image_layout``, see ``image_layout_of``): ``hwc`` when its last axis is <= 4 (Gymnasium's
  [H, W, C] convention, e.g. Atari's [210, 160, 3]), else ``chw`` when its first axis is <= 4;
* observation ``Dict{"observation": Box, "action_mask": Box | MultiBinary}`` (the PettingZoo classic
  convention) -> the ``observation`` Box as above plus ``spec.action_mask=True``; the mask must hold
  ``sum(nvec)`` flags (one block of ``nvec[i]`` per component) and any nonzero flag is written as 1 (legal);
* any other ``Dict`` or ``Tuple`` (nested; Box, Discrete, MultiDiscrete, MultiBinary leaves), or a Discrete,
  MultiDiscrete or MultiBinary space alone -> a structured observation carried flat (``EnvSpec.obs_leaves``,
  ``envs.obs_layout``; leaves from ``envs.adapters.gym_leaves``); a Dict's ``action_mask`` key is the action mask
  as above, and ``obs_keys`` (``env.obs_keys``) keeps only those top-level Dict keys;
* action ``Discrete(n, start)`` -> ``ActionSpace.discrete(n)``; Sluice's action ``a`` in ``[0, n)`` becomes
  ``start + a``;
* action ``MultiDiscrete(nvec, start)`` with a 1-D ``nvec`` -> ``ActionSpace.multi_discrete(nvec)``;
  component-wise ``start + a``, cast to the space's dtype;
* action ``MultiBinary(n)`` (e.g. a game pad's buttons) -> ``ActionSpace.multi_discrete([2] * n)``, each component
  0 or 1, cast to the space's dtype;
* action ``Box`` (float dtype, shape ``(d,)``) -> ``ActionSpace.box(low, high)``; Sluice's float32 action
  (an unclipped Gaussian sample) is clipped to ``[low, high]`` and cast to the space's dtype.

Anything else is a ValueError naming the env (its label), the space and what is supported. Observations
and masks an env returns are checked against the declared spaces (a structured one leaf by leaf: shape, integer or
number dtype, discrete values in range, finite floats); a mismatch is a ValueError naming the env, the env index,
the call (reset/step), the leaf, what came back and what was expected. An observation Box of the right shape whose
dtype differs only in width or kind of number is cast to the declared dtype (float64 for float32; Python ints for
uint8 when every value fits; ints for floats), as many envs return NumPy's defaults whatever their space says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from envs.adapters.gym_leaves import MASK_KEY, image_layout_of, leaves_of, select_keys
from envs.base import OBS_DTYPES, EnvSpec, StepBuffers
from envs.obs_layout import ObsFlattener, structured_obs
from envs.spaces import ActionSpace
from envs.errors import EnvConfigError, EnvRaised

SUPPORTED = ("supported: Box observation spaces (any dtype), Dict and Tuple observation spaces (nested) of Box, "
             "Discrete, MultiDiscrete and MultiBinary leaves (a Dict's 'action_mask' key, a Box or MultiBinary of "
             "sum(nvec) flags, is the action mask), or one Discrete, MultiDiscrete or MultiBinary; Discrete, "
             "MultiDiscrete (1-D nvec), MultiBinary (1-D) and Box (float dtype, 1-D shape) action spaces")
STRUCTURED = (spaces.Dict, spaces.Tuple, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
"""Observation spaces carried as a structured observation (``EnvSpec.obs_leaves``)."""


def _unsupported(label: str, which: str, space: spaces.Space, why: str = "") -> EnvConfigError:
    """The ValueError for a space Sluice cannot carry."""
    detail = f"; {why}" if why else ""
    text = " ".join(repr(space).split())  # one line, even for multi-dimensional nvec
    return EnvConfigError(f"{label}: {which} space is {text} ({type(space).__name__}){detail}; {SUPPORTED}")


def _action_space(label: str, space: spaces.Space) -> ActionSpace:
    """Sluice's ActionSpace for a Gymnasium action space (ValueError if unsupported)."""
    if isinstance(space, spaces.Discrete):
        return ActionSpace.discrete(int(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise _unsupported(label, "action", space, f"its nvec has shape {space.nvec.shape}, not 1-D")
        return ActionSpace.multi_discrete([int(n) for n in space.nvec])
    if isinstance(space, spaces.MultiBinary):
        if len(space.shape) != 1:
            raise _unsupported(label, "action", space, f"a MultiBinary action space needs shape (n,), not "
                                                       f"{space.shape}")
        return ActionSpace.multi_discrete([2] * int(space.shape[0]))
    if isinstance(space, spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise _unsupported(label, "action", space, f"a Box action space needs a float dtype, not {space.dtype}")
        if len(space.shape) != 1:
            raise _unsupported(label, "action", space, f"a Box action space needs shape (d,), not {space.shape}")
        return ActionSpace.box(space.low, space.high)
    raise _unsupported(label, "action", space)


def _observation_parts(label: str, space: spaces.Space,
                       obs_keys: Sequence[str]) -> tuple[spaces.Space, spaces.Space | None]:
    """(observation Box or structured space, action-mask space or None) of a supported observation space."""
    mask = space.spaces.get(MASK_KEY) if isinstance(space, spaces.Dict) else None
    if mask is not None and not isinstance(mask, (spaces.Box, spaces.MultiBinary)):
        raise _unsupported(label, "observation", space, f"its {MASK_KEY} is no Box or MultiBinary")
    obs = select_keys(label, space, obs_keys)
    if isinstance(obs, spaces.Dict) and mask is not None and set(obs.spaces) == {"observation"} \
            and isinstance(obs.spaces["observation"], spaces.Box):
        return obs.spaces["observation"], mask  # PettingZoo's classic {observation, action_mask}
    if isinstance(obs, (spaces.Box, *STRUCTURED)):
        return obs, mask
    raise _unsupported(label, "observation", space)


def spec_from_spaces(label: str, observation_space: spaces.Space, action_space: spaces.Space, *,
                     num_agents: int = 1, obs_keys: Sequence[str] = ()) -> EnvSpec:
    """The EnvSpec of an env whose agents have these spaces (``obs_keys``: the Dict keys kept, all when empty);
    ValueError naming ``label`` if unsupported."""
    obs, mask = _observation_parts(label, observation_space, obs_keys)
    action = _action_space(label, action_space)
    if mask is not None:
        if action.kind == "box":
            raise _unsupported(label, "observation", observation_space,
                               f"an action mask needs Discrete or MultiDiscrete actions, not {action_space!r}")
        if tuple(mask.shape) != (action.num_logits,):
            raise _unsupported(label, "observation", observation_space,
                               f"its action_mask has shape {tuple(mask.shape)} but the action space "
                               f"{action_space!r} needs ({action.num_logits},) flags (sum(nvec))")
    if isinstance(obs, STRUCTURED):
        return EnvSpec(num_agents=num_agents, action=action, action_mask=mask is not None,
                       **structured_obs(leaves_of(label, obs)))
    obs_shape = tuple(int(d) for d in obs.shape)
    obs_dtype = "float32" if np.dtype(obs.dtype) == np.float16 else np.dtype(obs.dtype).name  # see OBS_DTYPES
    if obs_dtype not in OBS_DTYPES:
        raise _unsupported(label, "observation", observation_space, f"its dtype {obs_dtype} is none of "
                                                                    f"{', '.join(OBS_DTYPES)}")
    return EnvSpec(num_agents=num_agents, obs_shape=obs_shape, obs_dtype=obs_dtype, action=action,
                   action_mask=mask is not None, image_layout=image_layout_of(obs_shape))


class SpaceConverter:
    """One agent's Gymnasium spaces and the conversions between them and Sluice's buffers.

    ``label`` prefixes every message (e.g. ``"gymnasium env 'CartPole-v1'"``); ``source`` names where the
    expected shapes come from (``observation_space``, ``single_observation_space``, ...). Methods taking
    ``where`` put it after the label (e.g. ``"(env 3)"``, ``"(env 0, agent 'agent_1')"``). ``obs_keys``
    (``env.obs_keys``): the top-level keys of a Dict observation to keep (all when empty).
    """

    def __init__(self, label: str, observation_space: spaces.Space, action_space: spaces.Space, *,
                 num_agents: int = 1, source: str = "observation_space", obs_keys: Sequence[str] = ()) -> None:
        """Build the spec (ValueError if unsupported) and remember how to convert actions and observations."""
        self.label = label
        self.source = source
        self.spec = spec_from_spaces(label, observation_space, action_space, num_agents=num_agents,
                                     obs_keys=obs_keys)
        self.action_space = action_space
        self._dict_obs = isinstance(observation_space, spaces.Dict)
        self._flattener = ObsFlattener(self.spec) if self.spec.obs_leaves else None
        self._obs_dtype = np.dtype(self.spec.obs_dtype)
        self._env_dtype = np.dtype(action_space.dtype) if action_space.dtype is not None else np.dtype(np.int64)
        action = self.spec.action
        if action.kind == "box":
            assert isinstance(action_space, spaces.Box)
            self._low = action_space.low.astype(np.float64)
            self._high = action_space.high.astype(np.float64)
        else:
            self._start = np.asarray(getattr(action_space, "start", 0), dtype=np.int64)
            self._nvec = np.asarray(action.nvec, dtype=np.int64).reshape(action.shape or ())

    # ----- actions -----

    def _range_text(self) -> str:
        """The legal Sluice actions, for messages."""
        action = self.spec.action
        if action.kind == "discrete":
            return f"[0, {action.nvec[0]})"
        return f"for {action.describe()} (component i in [0, nvec[i]))"

    def check_actions(self, actions: np.ndarray, where: Callable[[int], str]) -> None:
        """ValueError naming the first row ``b`` (as ``where(b)``) whose action is out of range or not finite.

        ``actions`` is ``[B, *action.shape]`` in Sluice's form (0-based ints / float32).
        """
        if self.spec.action.kind == "box":
            bad = ~np.isfinite(actions).reshape(len(actions), -1).all(axis=1)
            text = "is not finite"
        else:
            out = (actions < 0) | (actions >= self._nvec)
            bad = out.reshape(len(actions), -1).any(axis=1)
            text = f"is out of range {self._range_text()}"
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            value = actions[row].tolist()
            raise EnvConfigError(f"{self.label} {where(row)}: action {value} {text}")

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Sluice actions ``[B, *action.shape]`` as the env's batched actions (start added / clipped, env dtype)."""
        if self.spec.action.kind == "box":
            return np.clip(actions.astype(np.float64), self._low, self._high).astype(self._env_dtype)
        return (actions.astype(np.int64) + self._start).astype(self._env_dtype)

    def to_env_action(self, action: np.ndarray) -> Any:
        """One Sluice action as the env's action (a Python int for Discrete, an array otherwise)."""
        converted = self.to_env_actions(np.asarray(action)[None])[0]
        return int(converted) if self.spec.action.kind == "discrete" else converted

    def placeholder_action(self) -> np.ndarray:
        """A legal Sluice action (all zeros) to hand an env that ignores the action anyway."""
        return np.zeros(self.spec.action.shape, dtype=self.spec.action.dtype)

    # ----- observations and masks -----

    def obs_and_mask(self, raw: Any, *, call: str, where: str) -> tuple[np.ndarray, np.ndarray | None]:
        """One agent's (observation, uint8 mask or None) from what the env returned; ValueError on mismatch."""
        return self._extract(raw, (), call=call, where=where, noun="an observation")

    def batch_obs_and_mask(self, raw: Any, n: int, *, call: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``n`` stacked observations (and masks) from a vector env; ValueError on mismatch."""
        return self._extract(raw, (n,), call=call, where=f"(all {n} envs)", noun="observations")

    def _extract(self, raw: Any, lead: tuple[int, ...], *, call: str, where: str,
                 noun: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Split and validate observations with leading batch shape ``lead``."""
        prefix = f"{self.label} {where} {call}() returned"
        mask_raw: Any = None
        if self._flattener is not None:
            if self.spec.action_mask:
                if not isinstance(raw, Mapping) or MASK_KEY not in raw:
                    got = sorted(raw) if isinstance(raw, Mapping) else type(raw).__name__
                    raise EnvConfigError(f"{prefix} {noun} of {got}; expected a dict with the key '{MASK_KEY}' "
                                         f"(from its {self.source})")
                mask_raw = raw[MASK_KEY]
            obs = self._flattener.flatten(raw, lead=lead, where=prefix)
            return obs, None if mask_raw is None else self._mask(mask_raw, lead, prefix)
        if self._dict_obs:
            if not isinstance(raw, Mapping) or "observation" not in raw or "action_mask" not in raw:
                got = sorted(raw) if isinstance(raw, Mapping) else type(raw).__name__
                raise EnvConfigError(f"{prefix} {noun} of {got}; expected a dict with keys 'observation' and "
                                 f"'action_mask' (from its {self.source})")
            raw, mask_raw = raw["observation"], raw["action_mask"]
        obs = np.asarray(raw)
        expected = (*lead, *self.spec.obs_shape)
        if obs.shape == expected and obs.dtype != self._obs_dtype:
            obs, why = self._cast(obs)
        else:
            why = ""
        if obs.shape != expected or obs.dtype != self._obs_dtype:
            raise EnvConfigError(f"{prefix} {noun} with shape {obs.shape} dtype {obs.dtype}{why}; expected shape "
                             f"{expected} dtype {self.spec.obs_dtype} (from its {self.source})")
        if mask_raw is None:
            return obs, None
        return obs, self._mask(mask_raw, lead, prefix)

    def _cast(self, obs: np.ndarray) -> tuple[np.ndarray, str]:
        """``obs`` in the declared dtype where only its width or kind of number differs (float64 for a float32 Box,
        Python ints for a uint8 one): any number to a float dtype; an integer or bool to an integer dtype when every
        value fits. Otherwise ``obs`` unchanged, and why for the message ("" when the kinds do not convert)."""
        target = self._obs_dtype
        if target.kind == "f" and obs.dtype.kind in "biuf":
            return obs.astype(target), ""
        if target.kind in "iu" and obs.dtype.kind in "biu":
            info = np.iinfo(target)
            low, high = (int(obs.min()), int(obs.max())) if obs.size else (0, 0)
            if info.min <= low and high <= info.max:
                return obs.astype(target), ""
            return obs, f" (values {low} to {high}, beyond {target.name})"
        return obs, ""

    def _mask(self, mask_raw: Any, lead: tuple[int, ...], prefix: str) -> np.ndarray:
        """The uint8 action mask (1 = legal) from what the env returned; ValueError on mismatch."""
        mask = np.asarray(mask_raw)
        expected = (*lead, self.spec.mask_size)
        if mask.shape != expected or mask.dtype.kind not in "biuf":
            raise EnvConfigError(f"{prefix} an action mask with shape {mask.shape} dtype {mask.dtype}; expected "
                             f"shape {expected} of 0/1 flags (sum(nvec) per agent, from its {self.source})")
        return (mask != 0).astype(np.uint8)


def reward_value(raw: Any, where: Callable[[], str]) -> float:
    """A reward as a float: a number, or a NumPy array holding one number (what a reward computed with NumPy often
    is); EnvConfigError naming ``where()`` (the env, the call) for anything else."""
    if isinstance(raw, (float, int, np.number)):  # bool and np.bool_ are ints / numbers here
        return float(raw)
    value = np.asarray(raw)
    if value.size == 1 and value.dtype.kind in "biuf":
        return float(value.reshape(-1)[0])
    raise EnvConfigError(f"{where()} returned a reward of {type(raw).__name__} with shape {value.shape} dtype "
                         f"{value.dtype}; expected a number")


def rendered_frame(label: str, env: Any) -> np.ndarray:
    """``env.render()`` as a [height, width, 3] uint8 frame (``render_first`` of every adapter: env 0); EnvRaised
    naming ``label`` when it raises, EnvConfigError when it returns no RGB(A) image (the env was not made with
    ``render_mode='rgb_array'``)."""
    try:
        frame = env.render()
    except Exception as exc:
        raise EnvRaised(f"{label} (env 0) raised in render(): {exc!r}") from exc
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[-1] < 3:
        raise EnvConfigError(f"{label} rendered {type(frame).__name__} instead of an RGB frame; it needs "
                             "render_mode='rgb_array' (env.kwargs.render_mode)")
    return np.ascontiguousarray(frame[..., :3], dtype=np.uint8)


def close_each(envs: list, label: str) -> None:
    """Close every env of an adapter; the first failure is re-raised (naming ``label``) after closing the rest."""
    first_error: Exception | None = None
    for env in envs:
        try:
            env.close()
        except Exception as exc:  # keep closing the others
            first_error = first_error or exc
    if first_error is not None:
        raise EnvRaised(f"{label} raised in close(): {first_error!r}") from first_error


def report_episode(buffers: StepBuffers, slot: int, returns: np.ndarray, lengths: np.ndarray) -> None:
    """Report the episode of ``slot`` that ended on this step and start its return/length trackers afresh."""
    buffers.episode_done[slot] = True
    buffers.episode_return[slot] = returns[slot]
    buffers.episode_length[slot] = lengths[slot]
    returns[slot] = 0.0
    lengths[slot] = 0
