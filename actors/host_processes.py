"""Several actor host processes on one machine: ``python -m actors --n N --hosts K``.

One host process runs its loop on one thread (``actors/host.py``): deciding, recording and shipping every agent step
of its workers. On a machine with many cores that thread, not the envs, caps a cheap env's speed
(``ops/bench/pipeline.py`` reports it as ``host_max_agent_steps_per_s``). ``--hosts K`` splits the ``N`` workers among
``K`` host processes, each a complete host of its own (its workers, shared memory, registration, sockets and
/metrics), exactly as if they ran on ``K`` machines: the learner already serves any number of hosts.

This module is only the supervisor: it starts the hosts as ``python -m actors`` children (each in its own process
group, dying with the supervisor: PR_SET_PDEATHSIG), passes SIGINT and SIGTERM on to them, and when one host ends
with an error it stops the others, so the command ends as one host would. Its exit code is the first failed host's,
else 128 + the signal's number if a signal stopped it, else 0.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
POLL_S = 0.1
"""How often the supervisor looks at its hosts."""
STOP_GRACE_S = 30.0
"""How long hosts told to stop may take before they are killed (a host stops within a few seconds)."""


def split_workers(workers: int, hosts: int) -> list[int]:
    """``workers`` env workers dealt out to ``hosts`` host processes as evenly as possible (the first get one more)."""
    if hosts < 1 or workers < hosts:
        raise ValueError(f"{hosts} host processes need at least {hosts} env workers, got {workers}")
    return [workers // hosts + (i < workers % hosts) for i in range(hosts)]


def host_command(args: Namespace, workers: int, index: int) -> list[str]:
    """The ``python -m actors`` command line of host ``index``: ``args`` (the supervisor's parsed options) with its
    share of the workers, and its own /metrics port when a fixed one was given (``--metrics-port P``: P + index)."""
    command = [sys.executable, "-m", "actors", "--n", str(workers), "--learner", args.learner,
               "--device", args.device, "--metrics-host", args.metrics_host,
               "--metrics-port", str(args.metrics_port + index if args.metrics_port else 0),
               "--worker-nice", str(args.worker_nice), "--worker-scheduler", args.worker_scheduler,
               "--worker-threads", str(args.worker_threads)]
    if args.pool is not None:
        command += ["--pool", args.pool]
    for option, value in (("--curve-server-key", args.curve_server_key), ("--curve-client-key", args.curve_client_key)):
        if value:
            command += [option, value]
    for option, given in (("--insecure", args.insecure), ("--strict-keys", args.strict_keys),
                          ("--null-policy", args.null_policy)):
        if given:
            command.append(option)
    return command


def _die_with_supervisor() -> None:
    """In the child, before it runs: SIGTERM when the supervisor dies, however it dies (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_hosts(commands: Sequence[list[str]]) -> int:
    """Run one host per command until all have ended; the exit code as the module docstring says."""
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    hosts: list[subprocess.Popen] = []
    try:
        for command in commands:
            if received:
                break
            hosts.append(subprocess.Popen(command, process_group=0, preexec_fn=_die_with_supervisor))
        print(f"actors: {len(hosts)} host processes (pids {', '.join(str(h.pid) for h in hosts)})", flush=True)
        return _supervise(hosts, received)
    finally:
        for host in hosts:  # only on an error of the supervisor itself: normally every host has ended here
            if host.poll() is None:
                host.kill()
                host.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _supervise(hosts: list[subprocess.Popen], received: list[int]) -> int:
    """Wait for every host; pass each signal on once; stop the rest after the first failure."""
    failure: int | None = None
    forwarded = 0
    stop_deadline: float | None = None
    while any(host.poll() is None for host in hosts):
        if forwarded < len(received):
            for signum in received[forwarded:]:
                _signal_all(hosts, signum)
            forwarded = len(received)
            stop_deadline = stop_deadline or time.monotonic() + STOP_GRACE_S
        failed = next((host for host in hosts if host.returncode not in (None, 0)), None)
        if failed is not None and failure is None and not received:
            failure = failed.returncode
            print(f"actors: host process {failed.pid} ended with exit code {failure}; stopping the others",
                  file=sys.stderr, flush=True)
            _signal_all(hosts, signal.SIGTERM)
            stop_deadline = time.monotonic() + STOP_GRACE_S
        if stop_deadline is not None and time.monotonic() > stop_deadline:
            print(f"actors: host processes still running {STOP_GRACE_S:g} s after being told to stop; killing them",
                  file=sys.stderr, flush=True)
            for host in hosts:
                if host.poll() is None:
                    host.kill()
        time.sleep(POLL_S)
    if any(host.returncode < 0 for host in hosts):
        _remove_left_memory()
    if failure is None and received:
        return 128 + received[0]
    if failure is None:  # every host ended by itself; one that failed as the last ones ended still counts
        failure = next((host.returncode for host in hosts if host.returncode != 0), 0)
    return failure if failure >= 0 else 128 - failure  # a host killed by a signal: as a shell would say it


def _remove_left_memory() -> None:
    """Unlink the shared memory of hosts that were killed (and of any other dead sluice process)."""
    from actors.shm import remove_stale_segments

    removed = remove_stale_segments()
    if removed:
        print(f"actors: removed the shared memory of killed host processes: {', '.join(removed)}", file=sys.stderr,
              flush=True)


def _signal_all(hosts: list[subprocess.Popen], signum: int) -> None:
    for host in hosts:
        if host.poll() is None:
            host.send_signal(signum)
