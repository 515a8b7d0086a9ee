"""`python -m learner`: argument parsing and the top-level error handling of the learner.

Errors are told apart by type. The user's (``USER_ERRORS``: config, batch plan, run directory, addresses, an
env the config cannot build) print one line, ``python -m learner: error: ...``, and exit 2. Anything else
propagates with its traceback: a bug in the learner, or ``EnvRaised`` (the user's env raised while its spec
was read; the traceback from the child process that built it is the exception's cause). A run whose files
cannot be written (``RunFilesError``: a full disk, a read-only run directory) and a --resume without an intact
checkpoint (``NoIntactCheckpoint``) print one line and exit 1. A run a stop rule finished exits 0, one a signal
stopped 128 + the signal (``EXIT_CODES_HELP``). A --resume of a run that is already finished (its checkpoint meets a
stop rule under the resumed config) says so in one line, with how to go on, and exits 0 without binding: the run
did finish, and a script that resumes until done must not see a failure or a learner waiting for hosts.

Besides training: --plan (the batch plan), --print-config (the resolved config) and --print-prometheus-config (a
Prometheus config scraping the run: ``scrape_config``) print and exit 0. --seed N and --device D are --set
run.seed=N and --set run.device=D; an explicit --set giving the same key another value is an error naming both.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
import tomllib
from contextlib import nullcontext
from pathlib import Path

import yaml

from configs.loader import ConfigError, config_to_dict, load_config, parse_override, resolve_config_path
from configs.plan import PlanError, format_plan, make_plan, plan_rows
from envs.errors import EnvConfigError
from learner.serve.addresses import AddressError, learner_curve
from learner.monitor.scrape_config import ScrapeConfigError, format_scrape_config
from learner.monitor.progress import resolve_mode
from configs.rank_plan import make_rank_plan, torchrun_world_size
from configs.schema import RunConfig
from protocol.message_memory import keep_freed_memory
from protocol.curve import ServerCurve
from protocol.bind_rule import STRICT_SERVER_KEYS_HELP, InsecureEndpointError
from protocol.curve import CurveKeyError
from learner.run.checkpoint import TrainerState
from learner.run.resume_point import NoIntactCheckpoint, ResumePoint, pick_checkpoint
from learner.run.run_dir import RunDirError, check_resumable, fresh_run_dir, resume_config, schedule_jump_warning
from learner.run.run_files import RunFilesError, check_writable
from learner.run.run_record import begin_console_copy
from learner.stop_rules import check_stop_rules


USER_ERRORS = (ConfigError, PlanError, RunDirError, AddressError, EnvConfigError, CurveKeyError,
               InsecureEndpointError, ScrapeConfigError)
"""What the user asked for cannot be done as asked: one line and exit 2, no traceback."""
RUN_FAILURES = (RunFilesError, NoIntactCheckpoint)
"""The run cannot go on (its files cannot be written, no checkpoint is intact): one line and exit 1."""


EXIT_CODES_HELP = """exit codes:
  0    the run finished: a stop rule (trainer.total_timesteps, trainer.target_episode_return) ended it; or
       --resume found it finished already (one line says how to go on), and nothing was started
  1    a bug in the learner, or the env raised (with its traceback); or, in one line: the run directory cannot
       be written (a full disk, read-only), or --resume finds no intact checkpoint
  2    a usage error (config, run directory, addresses, env config): one line on stderr
  130  stopped by SIGINT (Ctrl-C), 143 stopped by SIGTERM: after the same clean shutdown and final checkpoint;
       continue with --resume --run-dir DIR"""


def build_parser() -> argparse.ArgumentParser:
    """The learner's command line."""
    parser = argparse.ArgumentParser(prog="python -m learner", description="Sluice learner: binds, trains PPO, "
                                     "publishes weights, checkpoints. Actor hosts connect with python -m actors.",
                                     epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--config", default=None, metavar="NAME_OR_FILE",
                        help="run config laid over configs/defaults.yaml: a shipped config's name (cartpole, "
                             "selfplay_connect4, ...) or a YAML file's path (default: cartpole)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")
    parser.add_argument("--seed", type=int, default=None, metavar="N", help="--set run.seed=N")
    parser.add_argument("--device", default=None, metavar="DEVICE", help="--set run.device=DEVICE (auto, cpu, cuda)")
    parser.add_argument("--plan", action="store_true", help="print the batch plan and exit")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (defaults, --config, --set) as YAML and exit")
    parser.add_argument("--print-prometheus-config", action="store_true",
                        help="print a Prometheus config scraping this run (the learner's network.metrics_port and "
                             "its actor hosts through the learner's discovery route; targets labelled run=<the "
                             "--run-dir's name, else run.name>) and exit")
    parser.add_argument("--json", action="store_true", help="with --plan: print it as one JSON object")
    parser.add_argument("--ranks", type=int, default=None, metavar="K",
                        help="with --plan: add one rank's share of the batch for K data-parallel learner ranks "
                             "(default: torchrun's WORLD_SIZE, else 1)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default: runs/<name>-<time>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its newest intact checkpoint")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="N",
                        help="with --resume: continue from the checkpoint of update N (newer ones are moved aside)")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument("--quiet", action="store_true",
                          help="no progress line (host join/leave and dropped-rows lines still print)")
    progress.add_argument("--plain", action="store_true",
                          help="progress as plain lines, one per 10 s with the update number and kl/clip/ev "
                               "(the default when stdout is not a terminal; on one, a single line is redrawn)")
    security = parser.add_argument_group("multi-host security (CurveZMQ; keys from python -m protocol.keys)")
    security.add_argument("--curve-secret-key", type=Path, metavar="FILE",
                          help="the learner's server.key_secret (network.curve_secret_key)")
    security.add_argument("--curve-allowed-clients", type=Path, metavar="DIR",
                          help="directory of allowed actor hosts' public .key files (network.curve_allowed_clients)")
    security.add_argument("--insecure", action="store_true",
                          help="allow binding beyond loopback without CURVE: no encryption, no authentication "
                               "(warns on every start)")
    security.add_argument("--strict-keys", action="store_true", help=STRICT_SERVER_KEYS_HELP)
    pool = parser.add_argument_group("self-play opponent pool (per-env geometric sampling of past snapshots; shorthands for --set selfplay.KEY=VALUE)")
    pool.add_argument("--per-env-opponent-sampling", action="store_true",
                      help="self-play with every env drawing its own opponent (selfplay.enabled and "
                           "selfplay.per_env_opponent_sampling)")
    pool.add_argument("--opponent-pool-size", type=int, metavar="K", help="selfplay.opponent_pool_size")
    pool.add_argument("--opponent-pool-beta", type=float, metavar="BETA",
                      help="selfplay.opponent_pool_beta (smaller = more weight on the newest snapshots)")
    pool.add_argument("--opponent-pool-exploration", type=float, metavar="EPS", help="selfplay.opponent_pool_exploration")
    return parser


def package_version() -> str:
    """The installed sluice package's version, or pyproject.toml's in a source tree that is not installed."""
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


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


def shortcut_overrides(args: argparse.Namespace) -> list[str]:
    """--seed / --device as --set overrides; ConfigError when an explicit --set gives the same key another value."""
    overrides = []
    for flag, key, value in (("--seed", "seed", args.seed), ("--device", "device", args.device)):
        if value is None:
            continue
        for text in args.overrides:
            try:
                given = parse_override(text)
            except ConfigError:
                continue  # load_config reports it
            if key in given.get("run", {}) and given["run"][key] != value:
                raise ConfigError(f"{flag} {value} and --set {text} both set run.{key}, to different values: "
                                  "give one of them")
        overrides.append(f"run.{key}={json.dumps(value)}")
    return overrides


def finished_line(run_dir: Path, config: RunConfig, state: TrainerState) -> str | None:
    """The line a --resume of a finished run prints (its checkpoint's ``state`` meets a stop rule of ``config``, the
    saved config with --set applied), saying how to go on; None when the run has more to do."""
    decision = check_stop_rules(config.trainer, state)
    if decision is None:
        return None
    trainer = config.trainer
    ways = []
    if decision.reason == "target return reached":
        ways.append(f"--set trainer.target_episode_return=null (or above {trainer.target_episode_return:g})")
    if state.agent_steps >= trainer.total_timesteps:
        ways.append(f"--set trainer.total_timesteps=N with N above {state.agent_steps:,} (it is "
                    f"{trainer.total_timesteps:,})")
    return (f"learner: run {run_dir} is finished ({decision.reason}: {state.agent_steps:,} agent steps, update "
            f"{state.update}); nothing to resume, nothing started. To train on: --resume --run-dir {run_dir} "
            f"{' '.join(ways)}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    keep_freed_memory()  # the ingest decodes multi-MB ROWS messages: reuse their pages
    console = begin_console_copy()  # what is said before the run directory exists reaches its console.log too
    try:
        return _main(args)
    finally:
        console.close()


def _main(args: argparse.Namespace) -> int:
    try:
        shortcuts = shortcut_overrides(args)
    except ConfigError as err:
        return _fail(str(err))
    args.overrides = [*args.overrides, *shortcuts, *selfplay_overrides(args), *curve_overrides(args)]
    if args.json and not args.plan:
        return _fail("--json only goes with --plan")
    if args.ranks is not None and not args.plan:
        return _fail("--ranks only goes with --plan (a training run takes its ranks from torchrun --nproc-per-node)")
    if args.ranks is not None and args.ranks < 1:
        return _fail(f"--ranks must be >= 1, got {args.ranks}")
    if args.checkpoint is not None and not args.resume:
        return _fail("--checkpoint only goes with --resume")
    point: ResumePoint | None = None
    try:
        if args.resume:
            if args.config is not None:
                return _fail("--resume takes the config saved in --run-dir; drop --config (use --set to override)")
            config = resume_config(args.run_dir, args.overrides)
        else:
            config = load_config(None if args.config is None else resolve_config_path(args.config), args.overrides)
        plan = make_plan(config.trainer, num_agents=config.env.num_agents)
        world_size = torchrun_world_size()
        if world_size > 1 and not (args.plan or args.print_config or args.print_prometheus_config):
            # every rank fails alike, before joining
            make_rank_plan(config.trainer, num_agents=config.env.num_agents, world_size=world_size, coma=config.coma)
        if args.print_config:
            print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
            return 0
        if args.print_prometheus_config:
            run = config.run.name if args.run_dir is None else args.run_dir.resolve().name
            print(format_scrape_config(config, run=run), end="")
            return 0
        if args.plan:
            rows = plan_rows(plan, config)
            plan_ranks = world_size if args.ranks is None else args.ranks
            if plan_ranks > 1:
                rows.update(rank_plan_rows(config, plan_ranks))
            print(json.dumps(rows) if args.json else format_plan(rows))
            return 0
        curve = learner_curve(config.network, insecure=args.insecure, strict_keys=args.strict_keys)
        if args.resume:
            check_resumable(args.run_dir)
            point = pick_checkpoint(args.run_dir, args.checkpoint)
            finished = finished_line(args.run_dir, config, point.checkpoint.trainer_state)
            if finished is not None:
                print(finished, flush=True)
                return 0
            check_writable(args.run_dir)
            warning = schedule_jump_warning(args.run_dir, config, update=point.checkpoint.trainer_state.update)
            if warning is not None:
                print(f"python -m learner: warning: {warning}", file=sys.stderr, flush=True)
    except USER_ERRORS as err:
        return _fail(str(err))
    except RUN_FAILURES as err:
        return _fail(str(err), code=1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if world_size > 1:
        return _run_rank(args, config, curve, point)
    # Heavy imports only when training (the plan needs none of them).
    from learner.trainer import Learner, install_signal_handlers

    try:
        # A fresh start that fails before training (a port in use) removes the run directory it made.
        with nullcontext(args.run_dir) if args.resume else fresh_run_dir(config, args.run_dir) as run_dir:
            learner = Learner(config, run_dir, resume=args.resume, curve=curve,
                              progress_mode=resolve_mode(args.quiet, args.plain, sys.stdout), resume_from=point)
            install_signal_handlers(learner)
            return learner.run()
    except USER_ERRORS as err:
        return _fail(str(err))
    except RUN_FAILURES as err:
        return _fail(str(err), code=1)


def rank_plan_rows(config: RunConfig, ranks: int) -> dict[str, int]:
    """What ``--plan --ranks K`` adds: one rank's share of the batch, and of each PPO minibatch or COMA gradient step."""
    rows = make_rank_plan(config.trainer, num_agents=config.env.num_agents, world_size=ranks,
                          coma=config.coma).as_dict()
    if config.trainer.algorithm != "coma":
        return rows
    rows = {key: value for key, value in rows.items() if not key.startswith("rank_minibatch")}
    rows["rank_coma_transitions_per_gradient_step"] = config.coma.batch_size // ranks
    return rows


def _run_rank(args: argparse.Namespace, config: RunConfig, curve: ServerCurve | None,
              point: ResumePoint | None) -> int:
    """One rank of a learner under torchrun (issue 15): rank 0 is the learner above with its ranks; the others
    follow it (learner/follower.py). The process group is left at the end, or, after a rank failure left collectives
    pending, the process ends at once (os._exit) once its output is flushed."""
    from learner.follower import FollowerRank
    from learner.ranks.context import join_ranks, leave_ranks
    from learner.build import resolve_device
    from learner.trainer import Learner, install_signal_handlers

    try:
        ranks = join_ranks(resolve_device(config.run.device))
    except USER_ERRORS as err:
        return _fail(str(err))
    code, broken = 1, True
    try:
        if ranks.rank > 0:
            follower = FollowerRank(config, ranks, curve=curve)
            follower.install_signal_handlers()
            code = follower.run()
            broken = code == 1
            return code
        with nullcontext(args.run_dir) if args.resume else fresh_run_dir(config, args.run_dir) as run_dir:
            learner = Learner(config, run_dir, resume=args.resume, curve=curve, ranks=ranks, resume_from=point,
                              progress_mode=resolve_mode(args.quiet, args.plain, sys.stdout))
            install_signal_handlers(learner)
            code = learner.run()
            broken = learner.update_cut_short
            return code
    except (*USER_ERRORS, *RUN_FAILURES) as err:
        code = _fail(f"learner rank {ranks.rank}: {err}", code=1 if isinstance(err, RUN_FAILURES) else 2)
        return code
    finally:
        leave_ranks(broken=broken, exit_code=code)


def _fail(message: str, *, code: int = 2) -> int:
    print(f"python -m learner: error: {message}", file=sys.stderr)
    return code
