"""`python -m actors`: argument parsing and top-level error handling of an actor host.

Exit codes, as the learner's: 0 when the learner ended the run (its SHUTDOWN), 128 + the signal's number when a
signal stopped the host (130 for SIGINT, 143 for SIGTERM), 1 on an error at run time (an env that cannot run, a
worker in a crash loop, the pool server failing), 2 on a usage or config error (the command line, the learner's
config, a learner that refuses this host).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys

from protocol.bind_rule import client_curve_for
from protocol.endpoints import parse_endpoint
from protocol.message_memory import keep_freed_memory
from telemetry.options import add_metrics_options, metrics_port_error

DEFAULT_LEARNER = "tcp://127.0.0.1:5555"
EXIT_CODES_HELP = ("exit codes: 0 the learner ended the run; 130 / 143 (128 + the signal's number) stopped by "
                   "SIGINT / SIGTERM;\n1 an error at run time (env, workers, pool server); 2 a usage or config "
                   "error, or a learner that refuses this host")
KEY_OPTIONS = "--curve-server-key server.key --curve-client-key NAME.key_secret"
MIN_NICE, MAX_NICE = 0, 19
"""The --worker-nice range: what a process may add to its own niceness without privileges (Linux caps it at 19)."""
DEVICES = ("cpu", "cuda")
"""Values of --device."""
WORKER_SCHEDULERS = ("batch", "normal")
"""Values of --worker-scheduler: Linux's SCHED_BATCH or its normal policy (SCHED_OTHER)."""


def package_version() -> str:
    """The installed ``sluice`` package's version (a source tree that was never installed has none)."""
    try:
        return importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (the sluice package is not installed; pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    """The actor host's command line."""
    parser = argparse.ArgumentParser(prog="python -m actors", description="Sluice actor host: env worker "
                                     "processes that stream experience to a learner.", epilog=EXIT_CODES_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}",
                        help="print the installed sluice version and exit")
    parser.add_argument("--n", type=int, default=None,
                        help="env worker processes on this host (default: the run's trainer.num_workers)")
    parser.add_argument("--hosts", type=int, default=1,
                        help="host processes to split the --n workers among (default 1): each is a host of its "
                             "own, with its own loop on its own core and the run's full env plan, as K machines "
                             "would be (actors/host_processes.py)")
    parser.add_argument("--learner", default=DEFAULT_LEARNER,
                        help=f"learner control address (default {DEFAULT_LEARNER})")
    parser.add_argument("--pool", default=None,
                        help="opponent-pool server address for self-play (default: the learner's, which serves "
                             "the pool itself; use this for `python -m learner.pool.server`)")
    security = parser.add_argument_group("multi-host security (CurveZMQ; keys from python -m protocol.keys)")
    security.add_argument("--curve-server-key", default="", metavar="FILE",
                          help="the learner's public server.key (required for a learner beyond loopback)")
    security.add_argument("--curve-client-key", default="", metavar="FILE",
                          help="this host's NAME.key_secret (its NAME.key must be in the learner's allowed clients)")
    security.add_argument("--insecure", action="store_true",
                          help="talk to a learner beyond loopback without CURVE (it must run with --insecure too)")
    security.add_argument("--strict-keys", action="store_true",
                          help="refuse to start when --curve-client-key can be read by group or others "
                               "(default: a warning; chmod 600 it)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where this host's policy runs its batched forward passes (default cpu; cuda shares "
                             "the machine's GPU with a learner there)")
    add_metrics_options(parser, port_default=0, port_help="port of this host's /metrics (default 0: a free port; "
                                                          "the learner hands it to Prometheus)")
    parser.add_argument("--worker-nice", type=int, default=0, metavar="N",
                        help="niceness the env workers add to their own, 0-19 (default 0): above 0 this host's "
                             "loop, and a learner on the same machine, get the CPU first when every core is busy. "
                             "Helps envs that step faster than the host decides and records (3-agent gridworld "
                             "on 2 cores: +17%% agent steps/s at 10, +26%% at 19), can cost the cheapest ones "
                             "(CartPole: -10%% at 19); docs/RESULTS.md")
    parser.add_argument("--worker-scheduler", choices=WORKER_SCHEDULERS, default="batch",
                        help="the env workers' Linux scheduling policy: batch (the default: a worker the host wakes "
                             "does not preempt the host on its core; the workers' CPU share stays the same; on 2 cores "
                             "+5-12%% agent steps/s on the gridworlds, +22-28%% on CartPole, docs/RESULTS.md) or "
                             "normal")
    parser.add_argument("--worker-threads", type=int, default=1, metavar="N",
                        help="threads of the numeric libraries (BLAS, OpenMP, torch) in each env worker (default 1: "
                             "one core per worker; more only for an env whose step runs large parallel products)")
    parser.add_argument("--null-policy", action="store_true",
                        help="benchmark mode: uniformly random (legal) actions instead of the learner's policy, "
                             "no network; rows still stream to the learner (ops/bench/pipeline.py uses it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.n is not None and args.n < 1:
        return _fail(f"--n must be at least 1, got {args.n}")
    if args.hosts < 1:
        return _fail(f"--hosts must be at least 1, got {args.hosts}")
    if args.hosts > 1 and args.n is None:
        return _fail(f"--hosts {args.hosts} needs --n: the env workers to split among the host processes")
    if args.hosts > 1 and args.n < args.hosts:
        return _fail(f"--hosts {args.hosts} needs at least {args.hosts} env workers (one per host process), "
                     f"got --n {args.n}")
    if not MIN_NICE <= args.worker_nice <= MAX_NICE:
        return _fail(f"--worker-nice must be {MIN_NICE} to {MAX_NICE} (added to the workers' niceness; a negative "
                     f"one would need root and take the CPU from the host), got {args.worker_nice}")
    if args.worker_threads < 1:
        return _fail(f"--worker-threads must be 1 or more (numeric-library threads in each env worker), got "
                     f"{args.worker_threads}")
    if (problem := metrics_port_error(args.metrics_port)) is not None:
        return _fail(problem)
    try:
        endpoint = parse_endpoint(args.learner, "--learner")
    except ValueError as err:
        return _fail(str(err))
    if endpoint.scheme == "tcp" and endpoint.host == "*":
        return _fail("--learner needs the learner's host name or address, not '*'")
    pool = None
    if args.pool is not None:
        try:
            pool = parse_endpoint(args.pool, "--pool")
        except ValueError as err:
            return _fail(str(err))
    try:
        curve = None
        for server in (endpoint, pool):
            if server is not None:
                curve = client_curve_for(server, server_key=args.curve_server_key, client_key=args.curve_client_key,
                                         insecure=args.insecure, who="--learner" if server is endpoint else "--pool",
                                         key_options=KEY_OPTIONS, strict_keys=args.strict_keys)
    except ValueError as err:  # CurveKeyError and InsecureEndpointError
        return _fail(str(err))
    if args.hosts > 1:
        from actors.host_processes import host_command, run_hosts, split_workers

        return run_hosts([host_command(args, workers, index)
                          for index, workers in enumerate(split_workers(args.n, args.hosts))])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    keep_freed_memory()  # each ROWS message is gathered into multi-MB arrays: reuse their pages
    from actors.stop_flag import StopFlag, StopNow, install_stop_signals

    stop = StopFlag()
    install_stop_signals(stop)  # before the heavy imports: a signal during them stops the host cleanly
    from actors import wiring  # heavy imports (torch, numba) only when running
    from actors.env_failures import EnvFailure
    from actors.learner_link import LearnerRefused
    from actors.pool_client import PoolError
    from actors.shm import SharedMemoryFull
    from actors.worker import WorkerPriority
    from configs.loader import ConfigError
    from configs.plan import PlanError
    from envs.errors import EnvConfigError
    from telemetry.exporter import MetricsBindError

    if args.device == "cuda" and not (args.null_policy or _cuda_available()):
        return _fail("--device cuda but torch sees no CUDA device (torch.cuda.is_available() is False); leave "
                     "--device out to run the policy on the CPU")
    options = wiring.HostOptions(learner=endpoint, num_workers=args.n, null_policy=args.null_policy, pool=pool,
                                 curve=curve, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
                                 device=args.device,
                                 worker_priority=WorkerPriority(nice=args.worker_nice,
                                                                batch=args.worker_scheduler == "batch",
                                                                threads=args.worker_threads))
    try:
        wiring.run_host(options, stop)
        return stop.exit_code()
    except StopNow as err:  # a second signal: the host's cleanup ran on the way out
        print(f"actors: stopped ({err})", flush=True)
        return 128 + err.signum
    except (ConfigError, PlanError, EnvConfigError, LearnerRefused, MetricsBindError) as err:  # the user's to fix; else a traceback
        return _fail(str(err))
    except (EnvFailure, PoolError) as err:  # the env or the pool server failed at run time; the reason says how
        return _fail(str(err), code=1)
    except SharedMemoryFull as err:
        return _fail(err.strerror, code=1)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _fail(message: str, code: int = 2) -> int:
    print(f"python -m actors: error: {message}", file=sys.stderr)
    return code
