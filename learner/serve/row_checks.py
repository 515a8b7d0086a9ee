"""What a ROWS message may hold beyond its arrays' names, dtypes and shapes: the content checks the ingest runs
before it counts or keeps anything from a message, so one hostile or broken message can neither crash an
update nor end a run. Every check raises ``ProtocolError`` with the reason the ingest counts the message under.

Arrays (one vectorised pass per field, the slow search for the first bad value only after a field failed):

* ``bad_action``: a discrete action outside ``[0, nvec[i])`` of its component, or one its step's action mask
  forbids. Every step of a shipped row holds a real action sampled under that step's mask: the host records
  only active agents of the learner's seats, a row ships only once all its steps are written (its first step
  is the previous row's last one), and the sampler leaves a component whose mask allows nothing unmasked.
* ``bad_flag``: a value other than 0 and 1 in a flag field (``dones``, ``action_masks``: ``RowField.flag``).
* ``non_finite`` / ``absurd_value``: NaN or inf, or a magnitude above ``network.max_abs_value``, in a float
  field the table marks ``bounded`` (observations, box actions, log-probs, values, rewards, bootstraps,
  recurrent states).
* ``bad_logprob``: a behaviour log-probability a policy of this action space cannot emit (``logprob_bounds``);
  without this bound a log-prob of -100 made every gradient step of an update non-finite.
* ``bad_row_version``: a negative policy version (rows from a policy newer than the learner's are dropped later
  as "future"; a negative one is no version at all).

Counters (``bad_counter``), as an actor host counts them between two ROWS messages (``actors/stepper.py``,
``actors/host.py``, see ``max_agent_steps``): env steps, agent steps and env restarts are >= 0; agent steps
are at most what the host's row buffer lets it record between two messages, and at most agents per env
times its env steps; episodes at most agents per env times env steps, and at most agent steps plus agent slots
(``max_episodes``: no flood of episodes in a message that counts no step). Episodes (``bad_episode``): lengths
from 1 to the int32 an env reports them in, returns finite and within ``max_abs_value`` per step.

Not checked: that an episode's length is at most the steps its host reported so far. Episodes start in earlier
messages, the ingest keeps no per-host history of counts, and a host that re-registers (or a learner that
resumes) starts that history afresh, so the bound would refuse genuine episodes; the length is what bounds a
return instead (``max_abs_value`` per step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.spaces import ActionSpace
from learner.serve.senders import Sender
from protocol import Message, ProtocolError
from protocol.rows import HOST_STATS, ROW_FIELDS, STEP_COUNTS
from protocol.validation import out_of_range_index

MAX_EPISODE_LENGTH = int(np.iinfo(np.int32).max)
"""Longest episode a host can report (envs write episode lengths into an int32 array)."""
LOG_FLOAT32_TINY = math.log(float(np.finfo(np.float32).tiny))
"""log of the smallest normal float32 (about -87.34): the floor of one categorical component's log-prob."""
LOG_FLOAT32_MAX = math.log(float(np.finfo(np.float32).max))
"""log of the largest float32 (about 88.72): how far a float32 log_std can reach before exp(-log_std) is inf."""
LOGPROB_TOLERANCE = 1e-3
"""Slack on each log-prob bound for the float32 rounding of a sum over components or dimensions."""
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True, kw_only=True)
class RowRules:
    """What one run's ingest accepts in a ROWS message beyond its array specs."""

    action: ActionSpace
    """The env's action space (discrete ranges; box actions are only bounded)."""
    mask_size: int
    """Width of an action mask (0: the env has no masks)."""
    bptt_horizon: int
    """Steps a row adds per agent once it is under way (a row holds bptt_horizon + 1 steps)."""
    rows_per_message: int
    """Most rows one ROWS message may carry (envs.rows.message_sizing, the rule the hosts ship by)."""
    max_abs_value: float
    """Largest magnitude accepted in a bounded float field (network.max_abs_value)."""
    agents_per_row: int = 1
    """Agents one row's step records: 1, or the env's agents in COMA's team rows (a host then writes a row per env)."""
    team_rows: bool = False
    """Rows are COMA's team rows, whose box actions come from the tanh-squashed Gaussian (``logprob_bounds``)."""


@dataclass(frozen=True, kw_only=True)
class HostReport:
    """What a ROWS message that passed every check reports besides its rows."""

    env_steps: int
    """Env steps the host took since its previous message."""
    agent_steps: int
    """Agent steps it recorded since its previous message (what total_timesteps counts)."""
    env_restarts: int
    """Env groups that raised and were rebuilt since its previous message."""
    returns: list[float]
    """Returns of the episodes that ended."""
    lengths: list[int]
    """Their lengths."""
    named_stats: dict[str, list[float]]
    """The env's named episode statistics of those episodes, by name."""
    host_stats: dict[str, float]
    """The host's timing counters (protocol.rows.HOST_STATS keys it sent)."""


def check_rows(arrays: dict[str, np.ndarray], rules: RowRules) -> None:
    """ProtocolError unless every row field's values are ones a real host produces (module docstring)."""
    for field in ROW_FIELDS:
        array = arrays[field.name]
        if field.bounded:
            check_bounded(field.name, array, rules.max_abs_value)
        if field.flag:
            _check_flags(field.name, array)
    if rules.action.kind != "box":
        _check_discrete_actions(arrays["actions"], rules.action)
        if rules.mask_size:
            _check_masked_actions(arrays["actions"], arrays["action_masks"], rules.action)
    _check_logprobs(arrays["logprobs"], rules)
    versions = arrays["versions"]
    if versions.size and versions.min() < 0:
        row = int(np.flatnonzero(versions < 0)[0])
        raise ProtocolError("bad_row_version", f"array 'versions': row {row} has policy version "
                                               f"{int(versions[row])}; versions are >= 0")


def check_bounded(name: str, array: np.ndarray, limit: float) -> None:
    """ProtocolError ``non_finite`` or ``absurd_value`` for NaN, inf or a magnitude above ``limit`` in a float
    array (integer arrays pass: their dtype bounds them)."""
    if array.dtype.kind != "f" or array.size == 0:
        return
    limit = min(limit, float(np.finfo(array.dtype).max))  # a narrow float (float16) compares without overflow
    if array.min() >= -limit and array.max() <= limit:  # NaN fails both comparisons
        return
    finite = np.isfinite(array)
    if not finite.all():
        index = _first(~finite)
        raise ProtocolError("non_finite", f"array '{name}' has a non-finite value {array[index]!r} at index {index}")
    index = _first(np.abs(array) > limit)
    raise ProtocolError("absurd_value", f"array '{name}' has {float(array[index])!r} at index {index}; "
                                        f"values must be within +-{limit:g} (network.max_abs_value)")


def logprob_bounds(rules: RowRules) -> tuple[float, float]:
    """The closed range of behaviour log-probabilities (one agent's whole action) a real host can send.

    Discrete kinds: ``ActionDistribution.sample`` draws each component from ``exp(log_softmax)`` in float32 and
    reports the sum of the components' log-softmax values. A log-softmax is <= 0 (its normaliser sums terms of
    which the largest is exp(0) = 1). An action whose probability is below the smallest normal float32 (log about
    -87.34; masked logits of -1e9 give exactly 0) is drawn with a chance below 1.2e-38 per draw, never in any run,
    so each component's log-prob is >= LOG_FLOAT32_TINY and the sum >= that times the number of components. The
    floor also keeps one component's V-trace ratio ``exp(logp_current - logp_behaviour) <= 1 / tiny`` finite in
    float32 (exp(87.34) = 8.5e37 < 3.4e38): -100 would overflow it.

    Box, per-agent rows (``ActionDistribution``'s diagonal Gaussian): per dimension
    ``-z**2 / 2 - log_std - log(2 pi) / 2`` with ``z = (a - mean) * exp(-log_std)``. The policy's log_std is an
    unclamped parameter, so only float32 limits it: where exp(-log_std) overflows, ``z`` is inf or NaN and the
    log-prob is non-finite, so a finite one has ``-log_std <= LOG_FLOAT32_MAX`` and a log-prob of at most
    ``dims * (LOG_FLOAT32_MAX - log(2 pi) / 2)`` (about 87.80 per dimension: a density can be positive). Below,
    a Gaussian density has no floor (a wide std, a far sample): only ``max_abs_value`` bounds it.

    Box, team rows (COMA's tanh-squashed Gaussian, log_std clamped to [-20, 2]): the Jacobian term
    ``-log(1 - tanh(u)**2)`` grows like ``2 |u|`` with the pre-tanh draw, which the policy's mean leaves
    unbounded, so only ``max_abs_value`` bounds it either way.

    Every bound is also clipped to ``+-max_abs_value``.
    """
    limit = rules.max_abs_value
    space = rules.action
    if space.kind != "box":
        low, high = len(space.nvec) * LOG_FLOAT32_TINY - LOGPROB_TOLERANCE, LOGPROB_TOLERANCE
    elif rules.team_rows:
        low, high = -limit, limit
    else:
        low, high = -limit, len(space.low) * (LOG_FLOAT32_MAX - _HALF_LOG_2PI) + LOGPROB_TOLERANCE
    return max(low, -limit), min(high, limit)


def _check_logprobs(logprobs: np.ndarray, rules: RowRules) -> None:
    """ProtocolError ``bad_logprob`` for a log-prob outside ``logprob_bounds`` (finite by now)."""
    if logprobs.size == 0:
        return
    low, high = logprob_bounds(rules)
    if logprobs.min() >= low and logprobs.max() <= high:
        return
    index = _first((logprobs < low) | (logprobs > high))
    raise ProtocolError("bad_logprob", f"array 'logprobs' has {float(logprobs[index])!r} at index {index}; a policy "
                                       f"over {rules.action.describe()} gives log-probabilities in "
                                       f"[{low:.6g}, {high:.6g}]")


def _check_flags(name: str, array: np.ndarray) -> None:
    if array.size == 0:
        return
    if array.max() <= 1 and (array.dtype.kind == "u" or array.min() >= 0):
        return
    index = _first((array != 0) & (array != 1))
    raise ProtocolError("bad_flag", f"array '{name}' has {array[index]!r} at index {index}; flags are 0 or 1")


def _check_discrete_actions(actions: np.ndarray, space: ActionSpace) -> None:
    index = out_of_range_index(actions, space.nvec)
    if index is not None:
        raise ProtocolError("bad_action", f"array 'actions': action {int(actions[index])} at index {index} is out "
                                          f"of range for {space.describe()}")


def _check_masked_actions(actions: np.ndarray, masks: np.ndarray, space: ActionSpace) -> None:
    """Each action's flag in its step's mask is 1, unless its component's mask allows nothing (then the sampler
    ignored it). Actions are in range and masks are 0/1 flags by now."""
    if actions.size == 0:
        return
    offsets = np.cumsum((0, *space.nvec[:-1]))
    picks = actions.reshape(*masks.shape[:-1], len(space.nvec)) + offsets
    chosen = np.take_along_axis(masks, picks, axis=-1)
    if chosen.all():
        return
    any_legal = np.maximum.reduceat(masks, offsets, axis=-1)
    illegal = (chosen == 0) & (any_legal != 0)
    if illegal.any():
        row, step, component = _first(illegal)
        raise ProtocolError("bad_action", f"array 'actions': row {row} step {step} took action "
                                          f"{int(picks[row, step, component] - offsets[component])} of component "
                                          f"{component}, which its action mask forbids")


def _first(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(bad)[0])


def max_agent_steps(num_rows: int, sender: Sender, rules: RowRules) -> int:
    """The most agent steps a real host reports in one ROWS message of ``num_rows`` rows.

    Derivation (``actors/stepper.py``, ``actors/host.py``, ``actors/assembler.py``): a host counts one agent step
    per step it records, clears the count with each message, and records a step only when its row buffer has a
    free row for every agent it steps. Its buffer holds P = 2 A + 2 R rows (A agent slots, R rows_per_message),
    A of them always being written. Nothing is released between two messages (a message releases its own rows
    just before it goes), so at most C <= P - A = A + 2 R rows complete in between; when the message carries
    fewer than R rows it took every full row, so C <= num_rows. An agent whose row is at position t0 >= 0
    records at most (c + 1) * bptt_horizon steps while completing c rows, so the steps are at most
    (C + A) * bptt_horizon. A restarted env worker's agents lose their partial rows; one more row's worth per
    agent (2 A instead of A) covers one such restart of every worker between two messages. In team rows the row
    writers are the A / agents_per_row envs and each recorded step counts agents_per_row agent steps.
    """
    writers = sender.agent_slots // rules.agents_per_row
    completed = num_rows if num_rows < rules.rows_per_message else writers + 2 * rules.rows_per_message
    return (completed + 2 * writers) * rules.bptt_horizon * rules.agents_per_row


def max_env_steps(num_rows: int, sender: Sender, rules: RowRules) -> int:
    """A sanity cap on one message's env steps: num_envs times ``max_agent_steps``. The host's code does not
    bound env steps that record no agent step (all of a group's learner agents inactive), so this only refuses
    claims far beyond any env whose learner agents act at least once per num_envs env steps."""
    return sender.num_envs * max_agent_steps(num_rows, sender, rules)


def max_episodes(agent_steps: int, sender: Sender) -> int:
    """The most episodes one ROWS message reporting ``agent_steps`` can carry: ``agent_steps + agent_slots``.

    Derivation (``actors/stepper.py``): a host reports an episode of a learner slot when its env's step ends it,
    and every episode holds at least one step of the slot it is reported for (lengths >= 1). Of the episodes
    one slot ends between two messages, only the first can have all its steps before the previous message;
    each later one started after the first ended, so one of its steps is among the ``agent_steps`` this message
    counts. So a message that counts no step reports at most one episode per agent slot (an opponent's move
    can end a game the learner's seat last moved in before the previous message).
    """
    return agent_steps + sender.agent_slots


def read_report(message: Message, *, sender: Sender, rules: RowRules, stat_names: tuple[str, ...]) -> HostReport:
    """The counters, episodes and timing of a ROWS message, checked (module docstring); ProtocolError if wrong."""
    fields = message.fields
    num_rows = fields["num_rows"]
    counts = {name: fields.get(name, 0) for name in STEP_COUNTS}  # env_restarts is optional, the rest required
    for name, value in counts.items():
        if value < 0:
            raise ProtocolError("bad_counter", f"ROWS field '{name}' must be >= 0, got {value}")
    env_steps, agent_steps, env_restarts = counts["env_steps"], counts["agent_steps"], counts["env_restarts"]
    agents_per_env = sender.agent_slots / max(1, sender.num_envs)
    slots_stepped = -(-env_steps * sender.agent_slots // max(1, sender.num_envs))  # agents of the envs stepped
    _at_most("agent_steps", agent_steps, max_agent_steps(num_rows, sender, rules),
             f"the most {sender.agent_slots} agent slots record between two messages of {num_rows} rows")
    _at_most("env_steps", env_steps, max_env_steps(num_rows, sender, rules),
             f"{sender.num_envs} envs times the most agent steps between two messages of {num_rows} rows")
    _at_most("agent_steps", agent_steps, slots_stepped,
             f"{agents_per_env:g} agents per env times env_steps {env_steps}")
    _at_most("env_restarts", env_restarts, env_steps + sender.num_envs,
             f"one per env group stepped, env_steps {env_steps} plus {sender.num_envs} envs")
    returns, lengths = _episodes(fields, rules.max_abs_value)
    _at_most("episode_returns", len(returns), slots_stepped,
             f"{agents_per_env:g} agents per env times env_steps {env_steps}")
    _at_most("episode_returns", len(returns), max_episodes(agent_steps, sender),
             f"agent_steps {agent_steps} plus {sender.agent_slots} agent slots: each slot's episodes but its first "
             f"end after a step this message counts")
    return HostReport(**counts, returns=returns, lengths=lengths,
                      named_stats=named_stats(message, stat_names, len(returns)), host_stats=host_stats(message))


def _at_most(name: str, value: int, limit: int, why: str) -> None:
    if value > limit:
        raise ProtocolError("bad_counter", f"ROWS field '{name}' is {value}, more than {limit} ({why})")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _episodes(fields: dict[str, Any], max_abs_value: float) -> tuple[list[float], list[int]]:
    """The finished episodes' returns and lengths: one length from 1 to MAX_EPISODE_LENGTH per finite return, each
    return within max_abs_value per step of its episode."""
    returns, lengths = fields["episode_returns"], fields["episode_lengths"]
    if len(returns) != len(lengths):
        raise ProtocolError("bad_field", f"{len(returns)} episode returns but {len(lengths)} lengths")
    if not all(_is_number(r) for r in returns):
        raise ProtocolError("bad_field", "episode_returns must be numbers")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
        raise ProtocolError("bad_field", "episode_lengths must be integers")
    for i, (value, length) in enumerate(zip(returns, lengths)):
        if not 1 <= length <= MAX_EPISODE_LENGTH:
            raise ProtocolError("bad_episode", f"episode_lengths[{i}] is {length}; allowed: 1..{MAX_EPISODE_LENGTH}")
        if not abs(value) <= max_abs_value * length:  # NaN and inf fail too
            raise ProtocolError("bad_episode", f"episode_returns[{i}] is {value!r}; allowed: finite, within "
                                               f"+-{max_abs_value:g} (network.max_abs_value) per step of its "
                                               f"length {length}")
    return [float(r) for r in returns], list(lengths)


def named_stats(message: Message, names: tuple[str, ...], episodes: int) -> dict[str, list[float]]:
    """The env's named episode statistics of a ROWS message: one finite number per episode for each name."""
    stats = message.fields.get("episode_stats", {})
    if set(stats) != set(names):
        raise ProtocolError("bad_field", f"episode_stats has {sorted(stats)}, the env declares {sorted(names)}")
    for name, values in stats.items():
        if not isinstance(values, list) or len(values) != episodes:
            raise ProtocolError("bad_field", f"episode_stats[{name!r}] must list one value per episode ({episodes})")
        if not all(_is_number(v) and math.isfinite(v) for v in values):
            raise ProtocolError("bad_field", f"episode_stats[{name!r}] must be finite numbers")
    return {name: [float(v) for v in values] for name, values in stats.items()}


def host_stats(message: Message) -> dict[str, float]:
    """The optional ``host_stats`` map of a ROWS message: known keys only, finite numbers >= 0."""
    stats = message.fields.get("host_stats", {})
    unknown = sorted(set(stats) - set(HOST_STATS))
    if unknown:
        raise ProtocolError("bad_field", f"host_stats has unknown keys {unknown}; allowed: {list(HOST_STATS)}")
    for name, value in stats.items():
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ProtocolError("bad_field", f"host_stats[{name!r}] must be a finite number >= 0, got {value!r:.40}")
    return {name: float(value) for name, value in stats.items()}
