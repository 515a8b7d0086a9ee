"""Benchmark: what one env group costs the actor host, in its two parts: the inference step and the wake round trip.

``python -m ops.bench.fixed_costs`` fits the host's CPU per env group (90-98 us on a 2-core AMD EPYC VM). This
splits it:

* ``act``: ``GroupStepper.act`` on one group (or ``--groups-per-call``), in this process, on buffers laid out as an
  actor host of the config lays them out (``ops.bench.assembler_copy.host_layout``), with the null policy (or
  ``--policy model``: the config's policy with its initial weights, on ``run.torch_threads`` threads of torch and
  of BLAS, as a host runs it) and no worker: the scan of the slots' flags with the observations' copy, the policy's
  draw, the actions' write and the row assembler's kernel. Every slot is active and observes zeros; no episode
  ends. Full rows are popped and released untimed. The record splits out ``decide_us_per_call``, the policy's share
  (the forward pass and the draw), and gives ``cpu_us_per_call``, the process's CPU (all its threads) per call.
* ``wake``: one round trip over a Unix socket pair to a process that sleeps in ``read`` until woken, steps for
  ``--step-us`` (a spin), and answers 2 bytes, the way the host wakes a worker (``actors/worker_channel.py``):
  the host's CPU per round trip (its write, its poll, its read) and the round trip's wall time. A worker asleep
  when its actions arrive costs this however small its group is.
* ``handoff``: the same round trip the way the host hands a group to a worker now (``actors/handoff.py``): the
  wake counted in shared memory, a pipe byte only to a process asleep; the answer counted back, the host looking
  once, then sleeping in its poll until the process's nudge. The process spins ``actors.handoff.SPIN_CHECKS``
  looks (about 10 us) before it sleeps: where a wake-up takes longer than that (a small VM), both sides sleep in
  each round trip, as with the pipe; a side that is still looking when the other's counter comes makes no system
  call.

Prints one JSON record per measurement round and kind.
Usage: .venv/bin/python -m ops.bench.group_cost [--config configs/cartpole.yaml ...] [--calls 20000] [--rounds 3]
[--step-us 0 50] [--groups-per-call 1] [--policy null|model] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import select
import time
from typing import Any

import multiprocess as mp
import numpy as np

from actors.assembler import RowAssembler
from actors.handoff import WorkerHandoff, publish_commands, set_flag, take_answers
from actors.inference import Inference
from actors.null_policy import NullInference
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.shm import ShmSegment, plan_layout, segment_name
from actors.slot_layout import SlotLayout
from actors.stepper import GroupStepper
from actors.worker_channel import WAKE, WorkerEnd
from configs.loader import ConfigError, load_config
from configs.schema import RunConfig
from envs.base import StepBuffers
from envs.rows import row_layout
from ops.bench.assembler_copy import host_layout
from ops.benchlib import emit, end_process, run_stoppable
from policies.threads import use_threads

DEFAULT_CONFIGS = ("configs/cartpole.yaml", "configs/grid_3agents.yaml")
QUIT = b"\xff"
ANSWER_TIMEOUT_MS = 5000
"""Longest wait for the woken process's answer before the bench stops with a message."""
HANDOFF_FIELDS, HANDOFF_BYTES = plan_layout([("commands", (1, 1), "int64"), ("answers", (1, 1), "int64"),
                                             ("sleeping", (2,), "int64")])
"""The handoff counters of one worker with one group, and the host's sleeping flag."""


def stepper_of(layout: dict, config: RunConfig, policy: str) -> tuple[GroupStepper, list]:
    """A GroupStepper over in-process buffers of ``layout`` (every slot active) with the ``policy`` (null, or the
    config's model), and its groups' views."""
    spec, workers, groups = layout["spec"], layout["workers"], layout["groups"]
    inference = NullInference(spec, seed=0) if policy == "null" else Inference(spec, config.model, seed=0)
    slots_per_group = layout["agents_per_call"] // workers
    envs_per_group = slots_per_group // spec.num_agents
    slot_layout = SlotLayout(workers=workers, groups=groups, envs_per_group=envs_per_group,
                             agents_per_env=spec.num_agents)
    slots = StepBuffers.allocate(spec, workers * groups * envs_per_group)
    slots.active[:] = True
    slots.rewards[:] = 0.0
    slots.obs[:] = 0
    rows = row_layout(spec, horizon=layout["horizon"], state_size=inference.state_size)
    assembler = RowAssembler.for_layout(rows, num_agents=layout["total_agents"], num_rows=layout["num_rows"])
    assembler.warm_up()
    stepper = GroupStepper(env_spec=spec, layout=slot_layout, inference=inference, assembler=assembler,
                           states=AgentStates(slot_layout.total_slots, inference.state_size))
    return stepper, list(slot_layout.group_views(slots))


def time_act(stepper: GroupStepper, views: list, calls: int, groups_per_call: int) -> tuple[float, float, int, float]:
    """Seconds of ``calls`` act calls on ``groups_per_call`` groups each (views in turn), this process's CPU seconds
    in them (every thread's: a BLAS library's threads show here), the agent steps, and the seconds of those in the
    policy's ``decide`` (as act reports them)."""
    assembler, report = stepper.assembler, RowsReport()
    steps, elapsed, cpu, decide_s = 0, 0.0, 0.0, 0.0
    for i in range(calls):
        batch = [views[(i * groups_per_call + k) % len(views)] for k in range(groups_per_call)]
        started, cpu_started = time.perf_counter(), time.process_time()
        stepper.act(batch, report)
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        steps += sum(len(view.slot_ids) for view in batch)
        if not assembler.can_accept(len(views[0].slot_ids) * len(views)):
            assembler.release(assembler.pop_full(assembler.full_rows()))
            decide_s += report.inference_s
            report = RowsReport()
    return elapsed, cpu, steps, decide_s + report.inference_s


def _sleeper(conn, step_s: float) -> None:  # conn: a multiprocess Connection, as a worker gets its pipe
    """Read a command (sleeping until one comes), spin ``step_s``, answer 2 bytes; until QUIT or EOF."""
    fd = conn.fileno()
    while True:
        command = os.read(fd, 64)
        if not command or command[:1] == QUIT:
            return
        started = time.perf_counter()
        while time.perf_counter() - started < step_s:
            pass
        os.write(fd, command[:1] + b"\x00")


def _round_trip(fd: int, poller: Any) -> None:  # poller: a select.poll() object
    """Wake the sleeping process and read its answer; SystemExit when it does not answer within ANSWER_TIMEOUT_MS."""
    try:
        os.write(fd, b"\x01")
    except OSError as err:
        raise SystemExit(f"group_cost: the woken process is gone ({err.strerror})") from None
    if not poller.poll(ANSWER_TIMEOUT_MS) or not os.read(fd, 64):
        raise SystemExit(f"group_cost: the woken process did not answer within {ANSWER_TIMEOUT_MS} ms (stopped, "
                         f"or gone)")


def time_wake(calls: int, step_us: float) -> tuple[float, float]:
    """This process's CPU seconds and the wall seconds of ``calls`` round trips to a sleeping process."""
    context = mp.get_context("spawn")
    host, worker = context.Pipe(duplex=True)  # a Unix socket pair, as WorkerPool._spawn makes
    process = context.Process(target=_sleeper, args=(worker, step_us / 1e6), daemon=True)
    process.start()
    worker.close()
    fd = host.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        for _ in range(min(calls, 100)):  # the process's start, untimed
            _round_trip(fd, poller)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            _round_trip(fd, poller)
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        _quit(fd, process)
        host.close()


def _handoff_sleeper(conn, name: str, step_s: float) -> None:  # conn: a multiprocess Connection
    """Take each group handed over (spinning, then sleeping on the pipe), spin ``step_s``, answer; until QUIT."""
    segment = ShmSegment.attach(name, HANDOFF_BYTES)
    arrays = segment.views(HANDOFF_FIELDS)
    handoff = WorkerHandoff(commands=arrays["commands"], answers=arrays["answers"], sleeping=arrays["sleeping"],
                            worker=0, channel=WorkerEnd(conn))
    while (group := handoff.next_group()) is not None:
        started = time.perf_counter()
        while time.perf_counter() - started < step_s:
            pass
        handoff.answer(group)


class HandoffHost:
    """The host's side of one worker's handoff, as ``WorkerPool`` and the host's loop do it."""

    def __init__(self, arrays: dict[str, Any], fd: int) -> None:
        self.commands, self.answers, self.sleeping = arrays["commands"], arrays["answers"], arrays["sleeping"]
        self.fd = fd
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)
        self.seen = np.zeros((1, 1), dtype=np.int64)
        self.alive = np.ones(1, dtype=np.uint8)
        self.zero = np.zeros(1, dtype=np.int64)
        self.nudge = np.zeros(1, dtype=np.bool_)
        self.answered = np.zeros(1, dtype=np.int64)

    def round_trip(self) -> None:
        """Hand the group over and wait for its answer; SystemExit without one within ANSWER_TIMEOUT_MS."""
        if publish_commands(self.commands, self.sleeping, self.zero, self.zero, self.nudge):
            try:
                os.write(self.fd, bytes([WAKE]))
            except OSError as err:
                raise SystemExit(f"group_cost: the process handed a group is gone ({err.strerror})") from None
        while not self._answered():
            set_flag(self.sleeping, 1, 1)
            try:
                if self._answered():
                    return
                if not self.poller.poll(ANSWER_TIMEOUT_MS) or not os.read(self.fd, 64):
                    raise SystemExit(f"group_cost: the process handed a group did not answer within "
                                     f"{ANSWER_TIMEOUT_MS} ms (stopped, or gone)")
            finally:
                set_flag(self.sleeping, 1, 0)

    def _answered(self) -> bool:
        return take_answers(self.commands, self.answers, self.seen, self.alive, self.answered) > 0


def time_handoff(calls: int, step_us: float) -> tuple[float, float]:
    """This process's CPU seconds and the wall seconds of ``calls`` handoff round trips."""
    context = mp.get_context("spawn")
    segment = ShmSegment.create(segment_name(os.getpid(), "group_cost"), HANDOFF_BYTES)
    host, worker = context.Pipe(duplex=True)
    process = context.Process(target=_handoff_sleeper, args=(worker, segment.name, step_us / 1e6), daemon=True)
    try:
        process.start()
        worker.close()
        handoff = HandoffHost(segment.views(HANDOFF_FIELDS), host.fileno())
        for _ in range(min(calls, 100)):  # the process's start, untimed
            handoff.round_trip()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            handoff.round_trip()
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        _quit(host.fileno(), process)
        host.close()
        handoff = None
        segment.close()


def _quit(fd: int, process: Any) -> None:
    """Send QUIT and join the process (killed if it lingers)."""
    try:
        os.write(fd, QUIT)
    except OSError:
        pass  # it is gone already: joined below
    end_process(process, timeout_s=5)


def bench(path: str, args: argparse.Namespace) -> None:
    config = load_config(path, args.overrides)
    use_threads(config.run.torch_threads)  # as an actor host of this config does
    layout = host_layout(config, None)
    stepper, views = stepper_of(layout, config, args.policy)
    groups_per_call = min(args.groups_per_call, len(views))
    time_act(stepper, views, min(args.calls, 1000), groups_per_call)  # warm: caches, the policy's first draws
    for round_number in range(1, args.rounds + 1):
        elapsed, cpu, steps, decide_s = time_act(stepper, views, args.calls, groups_per_call)
        emit({"bench": "group_cost", "kind": "act", "config": path, "overrides": args.overrides,
              "policy": args.policy, "threads": config.run.torch_threads, "round": round_number, "calls": args.calls,
              "groups_per_call": groups_per_call, "slots_per_group": len(views[0].slot_ids),
              "us_per_call": round(1e6 * elapsed / args.calls, 2),
              "cpu_us_per_call": round(1e6 * cpu / args.calls, 2),
              "decide_us_per_call": round(1e6 * decide_s / args.calls, 2),
              "us_per_agent_step": round(1e6 * elapsed / steps, 4)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", default=None,
                        help=f"repeatable; default: {' and '.join(DEFAULT_CONFIGS)}")
    parser.add_argument("--calls", type=int, default=20000, help="act calls, and wake round trips, per round")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each kind, in turn")
    parser.add_argument("--step-us", type=float, nargs="+", default=[0.0, 50.0],
                        help="the woken process's step before it answers (wake round trips; one record each)")
    parser.add_argument("--groups-per-call", type=int, default=1,
                        help="groups per act call (the host takes up to one per worker)")
    parser.add_argument("--policy", choices=("null", "model"), default="null",
                        help="act's policy: null (uniform random actions, no network) or model (the config's policy "
                             "with its initial weights)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every --config (e.g. model.obs_norm=true)")
    args = parser.parse_args()
    if args.calls < 1 or args.rounds < 1 or args.groups_per_call < 1:
        parser.error(f"--calls, --rounds and --groups-per-call: 1 at least, got {args.calls}, {args.rounds} and "
                     f"{args.groups_per_call}")
    if any(step < 0 for step in args.step_us):
        parser.error(f"--step-us: 0 or more, got {args.step_us}")
    for path in args.config or DEFAULT_CONFIGS:
        try:
            load_config(path, args.overrides)
        except ConfigError as err:
            parser.error(str(err))
    for round_number in range(1, args.rounds + 1):
        for step_us in args.step_us:
            for kind, timed in (("wake", time_wake), ("handoff", time_handoff)):
                cpu_s, wall_s = timed(args.calls, step_us)
                emit({"bench": "group_cost", "kind": kind, "round": round_number, "calls": args.calls,
                      "step_us": step_us, "host_cpu_us_per_round_trip": round(1e6 * cpu_s / args.calls, 2),
                      "wall_us_per_round_trip": round(1e6 * wall_s / args.calls, 2)})
    for path in args.config or DEFAULT_CONFIGS:
        bench(path, args)


if __name__ == "__main__":
    run_stoppable(main)
