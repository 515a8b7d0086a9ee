"""``python -m evaluation.check_env --config X``: will this env work with Sluice, and how fast does it step?

It builds the env the way an actor host does (``envs.registry.make_vec_env`` from the run's config, the learner's
spec probe first) and steps it with random legal actions, without a learner, a socket or shared memory. It prints
the spaces, the encoder ``model.encoder`` picks, the bytes of one row on the wire, the steps/s of one env and of a
vector of the plan's size, the episode lengths, and every problem as one line with its fix: NaN or inf, values the
learner's row checks would refuse (``network.max_abs_value``), an active agent without a legal action, results that
differ under the same seed, no episode ending. Exit status: 0 no problem, 1 problems found (or the env raised), 2 a
config or usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from configs.loader import ConfigError, load_config, resolve_config_path
from configs.plan import PlanError, make_plan
from configs.schema import RunConfig
from envs.base import EnvSpec, StepBuffers, VecEnv
from envs.errors import EnvConfigError, EnvRaised
from envs.registry import env_label, make_vec_env, probe_env_spec
from envs.rows import run_row_layout
from policies.encoders import encoder_kind
from policies.leaf_encoder import DictEncoder
from policies.factory import make_policy

PROG = "python -m evaluation.check_env"
DETERMINISM_STEPS = 200
"""Steps two envs built alike take with the same seed and actions before their results are compared."""
EPISODE_HORIZON_STEPS = 100_000
"""Steps without a single finished episode before that is reported (long enough for any sane time limit)."""


@dataclass(kw_only=True)
class Findings:
    """What the checks saw, as they go."""

    problems: list[str] = field(default_factory=list)
    """One line each: what is wrong and how to fix it."""
    episode_lengths: list[int] = field(default_factory=list)
    """Lengths of the episodes that ended while stepping."""

    def problem(self, line: str) -> None:
        """Note a problem once (the same line from several checks counts once)."""
        if line not in self.problems:
            self.problems.append(line)


def random_actions(spec: EnvSpec, buffers: StepBuffers, rng: np.random.Generator) -> None:
    """Write uniformly random legal actions into ``buffers.actions``: each discrete component among the entries its
    mask allows (all of them without a mask, or when the mask allows none), box actions uniform in their bounds."""
    action = spec.action
    slots = len(buffers.actions)
    if action.kind == "box":
        buffers.actions[:] = rng.uniform(action.low, action.high, size=(slots, len(action.low))).astype(np.float32)
        return
    actions = buffers.actions.reshape(slots, -1)
    start = 0
    for component, choices in enumerate(action.nvec):
        if spec.mask_size:
            legal = buffers.action_mask[:, start:start + choices].astype(bool)
            legal[~legal.any(axis=1)] = True
        else:
            legal = np.ones((slots, choices), dtype=bool)
        weights = rng.random((slots, choices)) * legal
        actions[:, component] = weights.argmax(axis=1)
        start += choices


def _env_call(what: str, call: Callable[[], None]) -> None:
    """Run one of the env's own methods; EnvRaised naming it when the user's code raises (the cause attached)."""
    try:
        call()
    except (EnvConfigError, EnvRaised):
        raise
    except Exception as err:  # the user's env code, whatever it raises: reported with its traceback
        raise EnvRaised(f"the env's {what} raised {type(err).__name__}: {err}") from err


def _check_values(spec: EnvSpec, buffers: StepBuffers, limit: float, findings: Findings) -> None:
    """NaN, inf or values beyond ``limit`` in what the learner's row checks bound; active agents without a legal
    action."""
    active = buffers.active
    arrays = {"observations": buffers.obs[active], "rewards": buffers.rewards[active],
              "global state": buffers.global_state[active]}
    for what, array in arrays.items():
        if array.dtype.kind != "f" or array.size == 0:
            continue
        if not np.isfinite(array).all():
            findings.problem(f"{what} hold NaN or inf: every row with one is refused (non_finite); fix the env, or "
                             f"clip and replace them in a wrapper")
        elif np.abs(array).max() > min(limit, float(np.finfo(array.dtype).max)):  # float16: no overflow
            findings.problem(f"{what} reach {float(np.abs(array).max()):g}, beyond network.max_abs_value ({limit:g}): "
                             f"such rows are refused (absurd_value); scale them down or raise network.max_abs_value")
    if spec.mask_size:
        masks = buffers.action_mask[active].reshape(int(active.sum()), -1)
        start = 0
        for choices in spec.action.nvec:
            if masks.size and not masks[:, start:start + choices].any(axis=1).all():
                findings.problem("an active agent has no legal action in its mask: the sampler then acts unmasked; "
                                 "mark the agent inactive (StepBuffers.active) or leave one action legal")
                break
            start += choices


def step_rate(env: VecEnv, spec: EnvSpec, *, seconds: float, seed: int, limit: float,
              findings: Findings) -> tuple[float, int]:
    """Step ``env`` with random legal actions for about ``seconds``, checking every step; (env steps/s, agent steps)."""
    buffers = StepBuffers.allocate(spec, env.num_envs)
    rng = np.random.default_rng(seed)
    _env_call("reset", lambda: env.reset(buffers, seed))
    _check_values(spec, buffers, limit, findings)
    steps = agent_steps = 0
    spent = 0.0
    while spent < seconds:
        random_actions(spec, buffers, rng)
        started = time.perf_counter()
        _env_call("step", lambda: env.step(buffers))
        spent += time.perf_counter() - started
        steps += 1
        agent_steps += int(buffers.active.sum())
        _check_values(spec, buffers, limit, findings)
        findings.episode_lengths.extend(int(n) for n in buffers.episode_length[buffers.episode_done])
    return steps * env.num_envs / max(spent, 1e-9), agent_steps


def deterministic(make: Callable[[], VecEnv], spec: EnvSpec, *, seed: int) -> bool:
    """Whether two envs built alike, reset with ``seed`` and given the same actions, write the same results."""
    runs = []
    for _ in range(2):
        env = make()
        try:
            buffers = StepBuffers.allocate(spec, env.num_envs)
            rng = np.random.default_rng(seed)
            _env_call("reset", lambda: env.reset(buffers, seed))
            trace = [buffers.obs.copy()]
            for _ in range(DETERMINISM_STEPS):
                random_actions(spec, buffers, rng)
                _env_call("step", lambda: env.step(buffers))
                trace += [buffers.obs.copy(), buffers.rewards.copy(), buffers.terminated.copy()]
        finally:
            env.close()
        runs.append(trace)
    return all(np.array_equal(a, b, equal_nan=a.dtype.kind == "f") for a, b in zip(*runs))


def describe_leaves(encoder: object) -> list[str]:
    """The per-leaf encoder lines of a structured observation's encoder (none for any other encoder)."""
    return encoder.describe() if isinstance(encoder, DictEncoder) else []


def describe(config: RunConfig, spec: EnvSpec) -> list[str]:
    """The spaces, the encoder and the row size, as lines."""
    action = spec.action
    bounds = f"low {list(action.low)} high {list(action.high)}" if action.kind == "box" else f"nvec {list(action.nvec)}"
    policy = make_policy(spec, config.model)
    state_size = policy.state_size
    layout = run_row_layout(config, spec, state_size=state_size)
    row_bytes = sum(int(np.prod(s.shape[1:], dtype=np.int64)) * np.dtype(s.dtype).itemsize
                    for s in layout.specs().values())
    lines = [f"env: {env_label(config.env)}, {spec.num_agents} agent(s) per env",
             f"observation: shape {list(spec.obs_shape)} {spec.obs_dtype}"
             + (f", structured: {len(spec.obs_leaves)} leaves carried flat" if spec.obs_leaves else "")
             + (f", image layout {spec.image_layout}" if spec.image_layout else "")
             + (", token list" if spec.tokens is not None else ""),
             f"action: {action.kind} {bounds}" + (", with action masks" if spec.action_mask else ""),
             f"global state: {spec.state_size} values" if spec.state_size else "global state: none",
             f"episode statistics: {', '.join(spec.episode_stats) or 'none'}",
             f"encoder (model.encoder {config.model.encoder}): {encoder_kind(spec, config.model)}",
             *[f"  {line}" for line in describe_leaves(getattr(policy, 'encoder', None))],
             f"one row on the wire: {row_bytes} bytes ({config.trainer.bptt_horizon + 1} steps"
             + (", one per env with all its agents" if layout.team_size else ", one agent") + ")"]
    if spec.tokens is None and len(spec.obs_shape) == 2 and spec.obs_shape[1] == 3 \
            and np.dtype(spec.obs_dtype).kind in "iu":
        lines.append("note: integer [L, 3] observations may be a padded token list (location, feature id, value); "
                     "if they are, declare it: env.tokens {num_locations, num_features, pad_value} "
                     "(docs/ENVIRONMENTS.md, token observations)")
    return lines


def vector_size(config: RunConfig) -> int:
    """Envs one actor-host worker steps together under the run's plan (1 when the plan does not hold)."""
    try:
        return make_plan(config.trainer, num_agents=config.env.num_agents).envs_per_worker
    except PlanError:
        return 1


def run_checks(config: RunConfig, *, seconds: float, seed: int, say: Callable[[str], None]) -> list[str]:
    """Every check on the config's env, said line by line; returns the problems."""
    spec = probe_env_spec(config.env, note=say)
    for line in describe(config, spec):
        say(line)
    findings = Findings()
    limit = config.network.max_abs_value
    for num_envs in sorted({1, vector_size(config)}):
        env = make_vec_env(config.env, num_envs)
        try:
            rate, agent_steps = step_rate(env, spec, seconds=seconds / 2, seed=seed, limit=limit, findings=findings)
        finally:
            env.close()
        say(f"speed, {num_envs} env(s): {rate:,.0f} env steps/s ({agent_steps:,} agent steps checked)")
    lengths = findings.episode_lengths
    if lengths:
        say(f"episodes: {len(lengths)} ended, length mean {np.mean(lengths):.1f}, min {min(lengths)}, "
            f"max {max(lengths)}")
    else:
        say("episodes: none ended while stepping")
        findings.problem("no episode ended within the check's steps: a run counts none (no returns, no stop "
                         "rule on returns); set env.max_steps or give the env a time limit")
    if not deterministic(lambda: make_vec_env(config.env, 1), spec, seed=seed):
        findings.problem("the same seed and actions gave different results: runs cannot be repeated; seed every "
                         "random source of the env from the seed VecEnv.reset receives")
    return findings.problems


def build_parser() -> argparse.ArgumentParser:
    """The checker's command line."""
    parser = argparse.ArgumentParser(prog=PROG, description="Build the run config's env as an actor host would, "
                                     "step it with random legal actions and say what would go wrong in training.")
    parser.add_argument("--config", default=None, metavar="NAME_OR_FILE",
                        help="run config laid over configs/defaults.yaml (default: cartpole)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")
    parser.add_argument("--seconds", type=float, default=4.0, help="stepping time in all (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="the envs' seed (default 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seconds <= 0:
        print(f"{PROG}: error: --seconds must be > 0, got {args.seconds:g}", file=sys.stderr)
        return 2
    try:
        config = load_config(None if args.config is None else resolve_config_path(args.config), args.overrides)
        problems = run_checks(config, seconds=args.seconds, seed=args.seed, say=print)
    except (ConfigError, EnvConfigError, PlanError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except EnvRaised as err:
        cause = err.__cause__
        where = traceback.extract_tb(cause.__traceback__)[-1] if cause is not None and cause.__traceback__ else None
        at = f" at {where.filename}:{where.lineno}" if where is not None else ""
        print(f"{PROG}: {err}{at}", file=sys.stderr)
        return 1
    for line in problems:
        print(f"problem: {line}")
    print(f"{len(problems)} problem(s)" if problems else "no problems found")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
