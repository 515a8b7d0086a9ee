"""An actor host's forward pass and draw for a small MLP policy (feed-forward, or with an LSTM cell) in NumPy,
without torch's cost per operation.

A CartPole policy (two tanh torsos of 32, a 2-logit head) does about 20 torch operations per inference step, each
costing microseconds whatever the batch holds: ``python -m ops.bench.group_cost --policy model`` measured its
``decide`` at 493 us for 32 agents, 28 times the rest of the inference step (docs/RESULTS.md). ``SmallMLP`` runs the
same network as NumPy matrix products over the policy's weights (read once per ``load``) and draws every agent's
action in one compiled pass.

It stands in for the torch module only where it computes the same function, checked on the module's structure when
the weights are read (``SmallMLP.of`` returns None otherwise, and the host keeps torch):

* ``policies.mlp.MLPPolicy`` or ``policies.lstm.LSTMPolicy`` (its ``nn.LSTMCell`` after the torso: the state
  ``[h, c]`` in, the next one out) on the CPU, its encoder ``ObsInput`` (observations flattened, as float32, times
  ``obs_scale``; with ``model.obs_norm`` then ``clip((x - mean) / std, -5, 5)`` with the running statistics the
  weights carried, as ``policies.obs_normalization.ObsNormalizer`` computes it);
* each torso (one, or one per head; an LSTM policy has one) alternating ``nn.Linear`` and ``nn.Tanh``;
* an ``ActionHead`` of a discrete, multi_discrete or box space, and a linear critic.

The discrete draw is the masked categorical of ``policies.distributions.ActionDistribution``: illegal actions get
``MASKED_LOGIT`` (probability 0), a component with no legal action is left unmasked, and the log-prob is the sum
over components of the chosen actions' log-softmax. The box draw is its diagonal Gaussian: ``mean + exp(log_std) *
noise``, unclipped, with the Gaussian's log-prob summed over dimensions. Uniforms come from the host's own SplitMix64
stream (``actors.random_stream``; normal noise from two of them by Box-Muller), seeded like the torch generator it
replaces. The products round differently from torch's (float32, another summation order): params and values agree
within ~1e-6, and the learner recomputes its own.
``tests/test_small_mlp.py`` checks all of this against the torch module.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from torch import nn

from actors.random_stream import uniform
from policies.distributions import MASKED_LOGIT, ActionHead
from policies.layers import ObsInput
from policies.obs_normalization import OBS_CLIP, ObsNormalizer
from policies.lstm import LSTMPolicy
from policies.mlp import MLPPolicy

_TWO_PI = 2.0 * math.pi
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

Layer = tuple[np.ndarray, np.ndarray]
"""One linear layer as NumPy: (weight transposed [in, out], bias [out]), float32, C-contiguous."""


@numba.njit(cache=True, inline="always")
def _logit(logits, masks, r, k, unmasked):
    """Agent ``r``'s logit ``k`` as the masked softmax reads it: ``MASKED_LOGIT`` where masked."""
    return logits[r, k] if unmasked or masks[r, k] != 0 else MASKED_LOGIT


@numba.njit(cache=True)
def _draw_categorical(state, logits, nvec, masks, actions, logprobs):
    """For each agent ``r`` and component: the masked log-softmax of its logits (``MASKED_LOGIT`` where
    ``masks[r, j] == 0``, unless nothing in the component is legal), one choice by the inverse CDF of a uniform of
    the stream ``state``, into ``actions[r, c]``; the chosen log-probs summed into ``logprobs[r]``. ``masks`` of
    width 0: no masks."""
    masked = masks.shape[1] > 0
    for r in range(logits.shape[0]):
        total = 0.0
        offset = 0
        for c in range(nvec.shape[0]):
            size = nvec[c]
            unmasked = True
            if masked:
                for j in range(size):
                    if masks[r, offset + j] != 0:
                        unmasked = False
                        break
            top = -math.inf
            for j in range(size):
                top = max(top, _logit(logits, masks, r, offset + j, unmasked))
            weight = 0.0
            for j in range(size):
                weight += math.exp(_logit(logits, masks, r, offset + j, unmasked) - top)
            threshold = uniform(state) * weight
            pick, last, cumulative = -1, 0, 0.0
            for j in range(size):
                share = math.exp(_logit(logits, masks, r, offset + j, unmasked) - top)
                if share > 0.0:
                    last = j
                cumulative += share
                if pick < 0 and threshold < cumulative and share > 0.0:
                    pick = j
            if pick < 0:  # the threshold at the total's rounding edge: the last choice with weight
                pick = last
            actions[r, c] = pick
            total += _logit(logits, masks, r, offset + pick, unmasked) - top - math.log(weight)
            offset += size
        logprobs[r] = total


@numba.njit(cache=True)
def _draw_gaussian(state, params, actions, logprobs):
    """For each agent ``r``: ``actions[r] = mean + exp(log_std) * noise`` (params ``[mean, log_std]``, ``d`` each;
    standard normal noise from two uniforms of the stream ``state`` by Box-Muller) and the diagonal Gaussian's
    log-prob of it, ``sum(-noise**2 / 2 - log_std - log(2 pi) / 2)``, into ``logprobs[r]``."""
    dims = actions.shape[1]
    for r in range(params.shape[0]):
        total = 0.0
        for j in range(dims):
            radius = math.sqrt(-2.0 * math.log(1.0 - uniform(state)))  # 1 - u in (0, 1]: log is finite
            noise = radius * math.cos(_TWO_PI * uniform(state))
            mean, log_std = params[r, j], params[r, dims + j]
            actions[r, j] = mean + math.exp(log_std) * noise
            total += -0.5 * noise * noise - log_std - _HALF_LOG_2PI
        logprobs[r] = total


def _linear(module: nn.Module) -> Layer:
    """An ``nn.Linear``'s weight (transposed) and bias as float32 NumPy arrays."""
    return np.ascontiguousarray(_float32(module.weight).T), _float32(module.bias)


def _torso_layers(torso: nn.Module) -> list[Layer] | None:
    """The layers of a torso that alternates ``nn.Linear`` and ``nn.Tanh`` (None for any other structure)."""
    modules = list(torso.children())
    if len(modules) % 2 or any(type(m) is not nn.Linear for m in modules[::2]) or \
            any(type(m) is not nn.Tanh for m in modules[1::2]):
        return None
    return [_linear(m) for m in modules[::2]]


class SmallMLP:
    """The NumPy twin of one eligible ``MLPPolicy`` or ``LSTMPolicy`` (``of``), with its own draw."""

    def __init__(self, *, obs_size: int, obs_scale: float, obs_norm: Layer | None, torso: list[Layer],
                 critic_torso: list[Layer] | None, cell: Layer | None = None, actor: Layer, log_std: np.ndarray | None,
                 critic: Layer, nvec: tuple[int, ...], seed: int, stream: np.ndarray | None = None) -> None:
        self.obs_size = obs_size
        self.obs_scale = np.float32(obs_scale)
        self.obs_norm = obs_norm
        """(mean, std) of each feature, float32 (``model.obs_norm``), or None: no normalisation."""
        self.torso = torso
        self.critic_torso = critic_torso
        """None: the critic reads the actor's torso (model.shared_torso, or an LSTM policy's one torso)."""
        self.cell = cell
        """An LSTM cell's input and recurrent weights stacked ([in + H, 4H], transposed) and its two biases summed
        ([4H]), or None: feed-forward."""
        self.state_size = 0 if cell is None else cell[0].shape[1] // 2
        """Floats of recurrent state per agent: h then c (0: feed-forward)."""
        self.actor = actor
        self.log_std = log_std
        """A box head's log standard deviations [d] (float32), or None: a discrete kind."""
        self.critic = critic
        self.nvec = np.asarray(nvec, dtype=np.int64)
        self.stream = np.array([seed], dtype=np.uint64) if stream is None else stream
        """The SplitMix64 state of the draws."""
        self.no_masks = np.zeros((0, 0), dtype=np.uint8)

    @classmethod
    def of(cls, policy: nn.Module, *, seed: int, stream: np.ndarray | None = None) -> "SmallMLP | None":
        """The twin of ``policy`` with its current weights, or None where it would not compute the same function
        (the module docstring's conditions); its draws go on in ``stream`` when given (a twin's ``stream`` before
        a weight load), else start from ``seed``."""
        recurrent = type(policy) is LSTMPolicy
        if not (type(policy) is MLPPolicy or recurrent) or type(policy.encoder) is not ObsInput:
            return None
        obs_norm = policy.encoder.obs_norm
        if obs_norm is not None and (type(obs_norm) is not ObsNormalizer or obs_norm.spatial_dims):
            return None
        actor = policy.actor
        if type(actor) is not ActionHead or type(policy.critic) is not nn.Linear:
            return None
        if recurrent and (type(policy.cell) is not nn.LSTMCell or policy.cell.bias is False):
            return None
        if next(policy.parameters()).device.type != "cpu":
            return None
        torso = _torso_layers(policy.torso)
        critic_torso = None if recurrent or policy.critic_torso is None else _torso_layers(policy.critic_torso)
        if torso is None or (not recurrent and policy.critic_torso is not None and critic_torso is None):
            return None
        return cls(obs_size=policy.encoder.obs_size, obs_scale=policy.encoder.obs_scale,
                   obs_norm=None if obs_norm is None else _statistics(obs_norm), torso=torso,
                   critic_torso=critic_torso, cell=_lstm_cell(policy.cell) if recurrent else None,
                   actor=_linear(actor.linear), log_std=None if actor.log_std is None else _float32(actor.log_std),
                   critic=_linear(policy.critic), nvec=tuple(policy.distribution.nvec), seed=seed, stream=stream)

    def step(self, obs: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs [n, *obs_shape] in the env's dtype and states [n, state_size] -> the head's params [n, param_size]
        (logits, or a box's means then log-stds), values [n] and the next states [n, state_size] (float32)."""
        features = np.multiply(obs.reshape(len(obs), self.obs_size), self.obs_scale, dtype=np.float32)
        if self.obs_norm is not None:
            mean, std = self.obs_norm
            features -= mean
            features /= std
            np.clip(features, -OBS_CLIP, OBS_CLIP, out=features)
        hidden = _run(features, self.torso)
        critic_hidden = hidden if self.critic_torso is None else _run(features, self.critic_torso)
        if self.cell is not None:
            hidden, states = _lstm_step(hidden, states, self.cell)
            critic_hidden = hidden
        weight, bias = self.actor
        params = hidden @ weight
        params += bias
        if self.log_std is not None:
            params = np.concatenate([params, np.broadcast_to(self.log_std, params.shape)], axis=1)
        weight, bias = self.critic
        values = critic_hidden @ weight
        values += bias
        return params, values[:, 0], states

    def draw(self, params: np.ndarray, masks: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Actions [n, components] int32 (a box: [n, d] float32) and their log-probs [n] float32 under ``masks``
        (None or width 0: none; a box has none). ValueError for params that are not all finite (torch's
        categorical draw refuses them too; a box's would send NaN actions to the env)."""
        if not np.isfinite(params).all():
            raise ValueError(f"the policy's outputs hold {int(np.count_nonzero(~np.isfinite(params)))} non-finite "
                             f"values (NaN or inf weights, or observations far outside their range)")
        n = len(params)
        logprobs = np.empty(n, dtype=np.float32)
        if self.log_std is not None:
            actions = np.empty((n, len(self.log_std)), dtype=np.float32)
            _draw_gaussian(self.stream, params, actions, logprobs)
            return actions, logprobs
        actions = np.empty((n, len(self.nvec)), dtype=np.int32)
        has_masks = masks is not None and masks.shape[-1]
        _draw_categorical(self.stream, params, self.nvec, masks if has_masks else self.no_masks, actions, logprobs)
        return actions, logprobs


def _float32(tensor) -> np.ndarray:
    """A tensor's values as a C-contiguous float32 NumPy array of its own."""
    return np.ascontiguousarray(tensor.detach().to("cpu").numpy(), dtype=np.float32).copy()


def _statistics(obs_norm: ObsNormalizer) -> Layer:
    """An ``ObsNormalizer``'s (mean, std) per feature in float32, as its forward pass casts them."""
    return _float32(obs_norm.stats.mean), _float32(obs_norm.stats.std())


def _lstm_cell(cell: nn.LSTMCell) -> Layer:
    """An ``nn.LSTMCell``'s weights as one product: ``[x, h] @ W + b`` gives its four gates (PyTorch's order: input,
    forget, cell, output)."""
    weight = np.concatenate([_float32(cell.weight_ih).T, _float32(cell.weight_hh).T], axis=0)
    return np.ascontiguousarray(weight), _float32(cell.bias_ih) + _float32(cell.bias_hh)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function as 0.5 + 0.5 tanh(x / 2) (the same function; in float32 no overflow for large |x|, where
    1 / (1 + exp(-x)) overflows exp)."""
    out = np.tanh(x * np.float32(0.5))
    out *= np.float32(0.5)
    out += np.float32(0.5)
    return out


def _lstm_step(inputs: np.ndarray, states: np.ndarray, cell: Layer) -> tuple[np.ndarray, np.ndarray]:
    """One LSTM cell step for n agents: inputs [n, in] and states [n, 2H] (h then c) -> h' [n, H], [h', c']."""
    weight, bias = cell
    size = weight.shape[1] // 4
    h, c = states[:, :size], states[:, size:]
    gates = np.concatenate([inputs, h], axis=1) @ weight
    gates += bias
    cell_next = _sigmoid(gates[:, size:2 * size]) * c
    cell_next += _sigmoid(gates[:, :size]) * np.tanh(gates[:, 2 * size:3 * size])
    hidden_next = _sigmoid(gates[:, 3 * size:]) * np.tanh(cell_next)
    return hidden_next, np.concatenate([hidden_next, cell_next], axis=1)


def _run(features: np.ndarray, layers: list[Layer]) -> np.ndarray:
    """A torso: tanh(x W + b) for each layer in turn."""
    hidden = features
    for weight, bias in layers:
        hidden = hidden @ weight
        hidden += bias
        np.tanh(hidden, out=hidden)
    return hidden
