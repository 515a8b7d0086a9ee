"""The actor host with each stage of its loop timed in thread CPU: where its CPU-us per agent step go.

``python -m ops.bench.host_stages --out PATH -- ARGS`` runs ``python -m actors ARGS`` with a thread-CPU clock
(``time.thread_time``) around each method of the tree below. When the host exits, PATH gets one JSON object: each
stage's CPU seconds and calls over the whole run (inclusive), the agent steps acted for, the whole process's CPU
seconds since the loop started, and the clock's own cost per timed call. ``python -m ops.bench.pipeline
--host-stages`` runs the host this way and adds ``stages_for`` of it to its record.

The clock reads cost a microsecond or two per timed call. A stage's figure carries part of that for its own calls and
all of it for the calls timed inside it: the record takes both out (measured on an empty function at the start).
What is left of the clock's error is a few percent of the host's CPU with groups of a few agents (a stage's figure
that would come out below zero is zero), and well under that with groups of a hundred.

``--without`` (``pipeline --host-without``) measures a design before it is built, by leaving out the work it would
spare. The learner, or the sink, then reads stale or poisoned rows: a measurement of the host's CPU, never a run to
learn from.

* ``gather``: the host lays each message's payload out in its shared-memory slot without copying the rows into it (the
  slot keeps the bytes an earlier message left there): what a host whose row pool lay in shared memory, and whose
  messages named rows of it, would spare. Each size of message is gathered for real once.
* ``add_obs``: the assembler records every field of a step but its observation (the rows keep the poison value):
  what a scan that wrote the observations straight into the rows, instead of into the staged batch, would spare.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import json
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from actors.assembler import RowAssembler, StagedSteps
from actors.cli import main as actors_main
from actors.host import ActorHost
from actors.inference import Inference
from actors.learner_link import LearnerLink
from actors.null_policy import NullInference
from actors.step_batch import StepBatch
from actors.stepper import GroupStepper
from actors.worker_pool import WorkerPool
from protocol.framing import PackedArrays, PackedLayout


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One timed method of the host's main thread."""

    name: str
    """The figure's name in the record."""
    owner: type
    """The class whose method is timed."""
    method: str
    """The method's name."""
    parent: str | None
    """The stage whose call this one runs inside (None: the host's loop itself)."""


STAGES = (
    Stage(name="loop", owner=ActorHost, method="run", parent=None),
    Stage(name="poll", owner=ActorHost, method="_poll", parent="loop"),
    Stage(name="collect", owner=WorkerPool, method="collect", parent="loop"),
    Stage(name="act", owner=ActorHost, method="_act_on_ready_groups", parent="loop"),
    Stage(name="act.step", owner=GroupStepper, method="act", parent="act"),
    Stage(name="act.scan", owner=StepBatch, method="scan", parent="act.step"),
    Stage(name="act.policy", owner=NullInference, method="decide", parent="act.step"),
    Stage(name="act.policy_model", owner=Inference, method="decide", parent="act.step"),
    Stage(name="act.wake", owner=WorkerPool, method="wake", parent="act.step"),
    Stage(name="act.assembler", owner=RowAssembler, method="add_staged", parent="act.step"),
    Stage(name="ship", owner=ActorHost, method="_ship_rows", parent="loop"),
    Stage(name="ship.gather", owner=RowAssembler, method="gather_packed", parent="ship"),
    Stage(name="ship.send", owner=LearnerLink, method="send_rows", parent="ship"),
)
"""The tree of timed stages; a stage's time beyond its children's is its ``.rest``."""


WITHOUT = ("gather", "add_obs")
"""The work ``--without`` can leave out (see the module docstring)."""


def stage_without_obs(method: Callable) -> Callable:
    """``RowAssembler.stage`` whose staged steps' kernel table leaves the observations out (the rows keep their
    poison)."""
    @functools.wraps(method)
    def without(self: RowAssembler, capacity: int) -> StagedSteps:
        staged = method(self, capacity)
        kept = [k for k, name in enumerate(staged.fields) if name != "obs"]
        return dataclasses.replace(staged, table=staged.table[kept], fields=tuple(staged.fields[k] for k in kept))
    return without


def gather_without_copy(method: Callable) -> Callable:
    """``RowAssembler.gather_packed`` that, into a slot (``into``), only lays the payload's arrays out (its padding
    zeroed) and leaves the rows' bytes uncopied, after one real gather of each row count; a fresh buffer is gathered as
    before (a message that carries its rows)."""
    layouts: dict[int, PackedLayout] = {}

    @functools.wraps(method)
    def without(self: RowAssembler, rows, into=None) -> PackedArrays:
        layout = layouts.get(len(rows))
        if into is None or layout is None:
            packed = method(self, rows, into)
            if into is not None:
                layouts[len(rows)] = packed.layout
            return packed
        return layout.allocate(into)
    return without


def _timed(stage: Stage, totals: dict[str, list[float]], method: Callable) -> Callable:
    totals[stage.name] = [0.0, 0]

    @functools.wraps(method)
    def timed(*args, **kwargs):
        began = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            total = totals[stage.name]
            total[0] += time.thread_time() - began
            total[1] += 1
    return timed


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _started(method: Callable, counts: dict[str, float]) -> Callable:
    """``ActorHost.run``, noting the process's CPU seconds when the loop first starts (after the imports and the
    workers' start)."""
    @functools.wraps(method)
    def started(*args, **kwargs):
        counts.setdefault("process_cpu_s_at_start", _process_cpu_s())
        return method(*args, **kwargs)
    return started


def _counted(method: Callable, counts: dict[str, float]) -> Callable:
    """``GroupStepper.act``, counting the agent steps it acts for (from its report's counter)."""
    @functools.wraps(method)
    def counted(self, groups, report, *args, **kwargs):
        before = report.agent_steps
        try:
            return method(self, groups, report, *args, **kwargs)
        finally:
            counts["agent_steps"] += report.agent_steps - before
    return counted


def clock_cost_s(calls: int = 20000) -> tuple[float, float]:
    """Thread CPU seconds a timed call of an empty function costs: what it measures itself (between its two clock
    reads), and what it costs its caller in all."""
    totals: dict[str, list[float]] = {}
    empty = _timed(STAGES[0], totals, lambda: None)
    began = time.thread_time()
    for _ in range(calls):
        empty()
    return totals[STAGES[0].name][0] / calls, (time.thread_time() - began) / calls


def instrument(without: tuple[str, ...] = ()) -> Callable[[], dict]:
    """Time every stage, leaving out the work ``without`` names (``WITHOUT``); a function that returns what was
    measured so far."""
    if "gather" in without:
        RowAssembler.gather_packed = gather_without_copy(RowAssembler.gather_packed)
    if "add_obs" in without:
        RowAssembler.stage = stage_without_obs(RowAssembler.stage)
    totals: dict[str, list[float]] = {}
    counts: dict[str, float] = {"agent_steps": 0}
    clock_inner_s, clock_s = clock_cost_s()
    for stage in STAGES:
        setattr(stage.owner, stage.method, _timed(stage, totals, getattr(stage.owner, stage.method)))
    GroupStepper.act = _counted(GroupStepper.act, counts)
    ActorHost.run = _started(ActorHost.run, counts)

    def measured() -> dict:
        return {"stages": totals, "agent_steps": counts["agent_steps"], "clock_s_per_call": clock_s,
                "clock_inner_s_per_call": clock_inner_s,
                "process_cpu_s": _process_cpu_s() - counts.get("process_cpu_s_at_start", 0.0)}
    return measured


def stages_for(measured: dict) -> dict:
    """CPU-us per agent step of each stage beyond its children (``NAME.rest`` for a stage that has children), with the
    clock's cost taken out; ``main_thread`` is the loop's total and ``process`` the whole host process's (its other
    threads: ZeroMQ's IO thread, the metrics server), both over the host's whole loop."""
    steps = max(measured["agent_steps"], 1)
    clock_s, clock_inner_s = measured["clock_s_per_call"], measured["clock_inner_s_per_call"]
    totals = {name: (seconds, calls) for name, (seconds, calls) in measured["stages"].items()}
    nested_calls = {stage.name: 0 for stage in STAGES}
    children: dict[str, list[str]] = {stage.name: [] for stage in STAGES}
    for stage in STAGES:
        ancestor = stage.parent
        while ancestor is not None:
            nested_calls[ancestor] += totals[stage.name][1]
            ancestor = next(s.parent for s in STAGES if s.name == ancestor)
        if stage.parent is not None:
            children[stage.parent].append(stage.name)
    own = {name: seconds - clock_inner_s * calls - clock_s * nested_calls[name]
           for name, (seconds, calls) in totals.items()}
    figures = {}
    for stage in STAGES:
        if not totals[stage.name][1]:
            continue
        beyond = own[stage.name] - sum(own[child] for child in children[stage.name])
        name = f"{stage.name}.rest" if children[stage.name] else stage.name
        figures[name] = round(1e6 * max(beyond, 0.0) / steps, 3)
    figures["main_thread"] = round(1e6 * own["loop"] / steps, 3)
    timed_calls = sum(calls for _, calls in totals.values())
    figures["process"] = round(1e6 * max(measured["process_cpu_s"] - clock_s * timed_calls, 0.0) / steps, 3)
    return {"host_stages_cpu_us_per_agent_step": figures, "host_stages_agent_steps": measured["agent_steps"],
            "host_stages_clock_us_per_call": round(1e6 * clock_s, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the host's measured stages go (JSON), when it exits")
    parser.add_argument("--without", action="append", choices=WITHOUT, default=[],
                        help="leave this work out of the host's loop, to measure what a design that spares it would "
                             "save (gather: rows are not copied into the shared-memory slot; add_obs: the assembler "
                             "does not copy observations into the rows); repeatable")
    parser.add_argument("actors_args", nargs=argparse.REMAINDER, help="-- then python -m actors's arguments")
    args = parser.parse_args()
    actors_args = args.actors_args[1:] if args.actors_args[:1] == ["--"] else args.actors_args
    measured = instrument(tuple(args.without))

    def write() -> None:
        with open(args.out, "w") as out:
            json.dump(measured(), out)
    atexit.register(write)
    return actors_main(actors_args)


if __name__ == "__main__":
    sys.exit(main())
