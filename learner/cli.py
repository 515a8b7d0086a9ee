"""`python -m learner`: argument parsing and the top-level error handling of the learner.

Errors are told apart by type. The user's (``USER_ERRORS``: config, batch plan, run directory, addresses, an
env the config cannot build) print one line, ``python -m learner: error: ...``, and exit 2. Anything else
propagates with its traceback: a bug in the learner, or ``EnvRaised`` (the user's env raised while its spec
was read; the traceback from the child process that built it is the exception's cause).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from configs.loader import ConfigError, load_config
from configs.plan import PlanError, format_plan, make_plan
from envs.errors import EnvConfigError
from learner.addresses import AddressError, learner_curve
from protocol.bind_rule import InsecureEndpointError
from protocol.curve import CurveKeyError
from learner.run_dir import RunDirError, new_run_dir, resume_config

USER_ERRORS = (ConfigError, PlanError, RunDirError, AddressError, EnvConfigError, CurveKeyError,
               InsecureEndpointError)
"""What the user asked for cannot be done as asked: one line and exit 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    """The learner's command line."""
    parser = argparse.ArgumentParser(prog="python -m learner", description="Sluice learner: binds, trains PPO, "
                                     "publishes weights, checkpoints. Actor hosts connect with python -m actors.")
    parser.add_argument("--config", type=Path, default=None,
                        help="run config YAML laid over configs/defaults.yaml (default: configs/cartpole.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")
    parser.add_argument("--plan", action="store_true", help="print the batch plan and exit")
    parser.add_argument("--json", action="store_true", help="with --plan: print it as one JSON object")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default: runs/<name>-<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    security = parser.add_argument_group("multi-host security (CurveZMQ; keys from python -m protocol.keys)")
    security.add_argument("--curve-secret-key", type=Path, metavar="FILE",
                          help="the learner's server.key_secret (network.curve_secret_key)")
    security.add_argument("--curve-allowed-clients", type=Path, metavar="DIR",
                          help="directory of allowed actor hosts' public .key files (network.curve_allowed_clients)")
    security.add_argument("--insecure", action="store_true",
                          help="allow binding beyond loopback without CURVE: no encryption, no authentication "
                               "(warns on every start)")
    pool = parser.add_argument_group("self-play opponent pool (seeds/002; shorthands for --set selfplay.KEY=VALUE)")
    pool.add_argument("--per-env-opponent-sampling", action="store_true",
                      help="self-play with every env drawing its own opponent (selfplay.enabled and "
                           "selfplay.per_env_opponent_sampling)")
    pool.add_argument("--opponent-pool-size", type=int, metavar="K", help="selfplay.opponent_pool_size")
    pool.add_argument("--opponent-pool-beta", type=float, metavar="BETA",
                      help="selfplay.opponent_pool_beta (smaller = more weight on the newest snapshots)")
    pool.add_argument("--opponent-pool-exploration", type=float, metavar="EPS", help="selfplay.opponent_pool_exploration")
    return parser


def curve_overrides(args: argparse.Namespace) -> list[str]:
    """--curve-secret-key / --curve-allowed-clients as --set overrides, with absolute paths (a resumed run may start
    from another directory)."""
    overrides = []
    for flag, key in (("curve_secret_key", "curve_secret_key"), ("curve_allowed_clients", "curve_allowed_clients")):
        path = getattr(args, flag)
        if path is not None:
            overrides.append(f"network.{key}={json.dumps(str(path.resolve()))}")
    return overrides


def selfplay_overrides(args: argparse.Namespace) -> list[str]:
    """The seed's self-play flags as --set overrides (applied after the explicit --set values)."""
    overrides = []
    if args.per_env_opponent_sampling:
        overrides += ["selfplay.enabled=true", "selfplay.per_env_opponent_sampling=true"]
    for flag, key in (("opponent_pool_size", "opponent_pool_size"), ("opponent_pool_beta", "opponent_pool_beta"),
                      ("opponent_pool_exploration", "opponent_pool_exploration")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"selfplay.{key}={value}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.overrides = [*args.overrides, *selfplay_overrides(args), *curve_overrides(args)]
    if args.json and not args.plan:
        return _fail("--json only goes with --plan")
    try:
        if args.resume:
            if args.config is not None:
                return _fail("--resume takes the config saved in --run-dir; drop --config (use --set to override)")
            config = resume_config(args.run_dir, args.overrides)
        else:
            config = load_config(args.config, args.overrides)
        plan = make_plan(config.trainer, num_agents=config.env.num_agents)
        curve = None if args.plan else learner_curve(config.network, insecure=args.insecure)
    except USER_ERRORS as err:
        return _fail(str(err))
    if args.plan:
        print(json.dumps(plan.as_dict()) if args.json else format_plan(plan))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Heavy imports only when training (the plan needs none of them).
    from learner.trainer import Learner, install_signal_handlers

    try:
        run_dir = args.run_dir if args.resume else new_run_dir(config, args.run_dir)
        learner = Learner(config, run_dir, resume=args.resume, curve=curve)
        install_signal_handlers(learner)
        return learner.run()
    except USER_ERRORS as err:
        return _fail(str(err))


def _fail(message: str) -> int:
    print(f"python -m learner: error: {message}", file=sys.stderr)
    return 2
