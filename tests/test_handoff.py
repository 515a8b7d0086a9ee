"""actors.handoff: groups handed between the host and a worker through counters in shared memory, a pipe byte only
to a side that sleeps; no wake lost with both sides going to sleep at random moments (a real process)."""

from __future__ import annotations

import os
import random
import select
import threading
import time

import multiprocess as mp
import numpy as np
import pytest

from actors import handoff as handoff_module
from actors.handoff import WorkerHandoff, next_group, publish_answer, publish_commands, set_flag, take_answers
from actors.shm import ShmSegment, plan_layout, segment_name
from actors.worker_channel import QUIT, STATUS_NUDGE, WAKE, HostEnd, Reply, WorkerEnd
from tests.processes import shm_segments


class Counters:
    """Two workers of two groups each, the host's bookkeeping beside."""

    def __init__(self, workers: int = 2, groups: int = 2) -> None:
        self.commands = np.zeros((workers, groups), dtype=np.int64)
        self.answers = np.zeros((workers, groups), dtype=np.int64)
        self.sleeping = np.zeros(workers + 1, dtype=np.int64)
        self.seen = np.zeros((workers, groups), dtype=np.int64)
        self.alive = np.ones(workers, dtype=np.uint8)
        self.out = np.zeros(workers * groups, dtype=np.int64)

    def hand_over(self, *pairs: tuple[int, int]) -> tuple[bool, list[bool]]:
        workers = np.array([w for w, _ in pairs], dtype=np.int64)
        groups = np.array([g for _, g in pairs], dtype=np.int64)
        nudge = np.zeros(len(pairs), dtype=np.bool_)
        any_sleeps = publish_commands(self.commands, self.sleeping, workers, groups, nudge)
        return bool(any_sleeps), nudge.tolist()

    def take(self) -> list[int]:
        n = take_answers(self.commands, self.answers, self.seen, self.alive, self.out)
        return self.out[:n].tolist()


def test_a_group_handed_over_is_taken_once_and_its_answer_collected_once() -> None:
    c = Counters()
    taken = np.zeros(2, dtype=np.int64)
    assert next_group(c.commands, taken, 1, 0, 3) == -1
    assert c.hand_over((1, 1)) == (False, [False])
    assert next_group(c.commands, taken, 0, 0, 3) == -1  # another worker's group
    assert next_group(c.commands, taken, 1, 0, 3) == 1
    assert next_group(c.commands, taken, 1, 0, 3) == -1 and taken.tolist() == [0, 1]
    assert c.take() == []  # not answered yet
    assert not publish_answer(c.answers, c.sleeping, 1, 1, int(taken[1]), 2)
    assert c.take() == [1 * 2 + 1]
    assert c.take() == []


def test_only_sleeping_workers_are_nudged_and_an_answer_nudges_only_a_sleeping_host() -> None:
    c = Counters()
    set_flag(c.sleeping, 1, 1)
    assert c.hand_over((0, 0), (1, 0), (1, 1)) == (True, [False, True, True])
    assert not publish_answer(c.answers, c.sleeping, 0, 0, 1, 2)
    set_flag(c.sleeping, 2, 1)
    assert publish_answer(c.answers, c.sleeping, 1, 0, 1, 2)
    assert sorted(c.take()) == [0, 2]


def test_an_answer_to_an_older_wake_or_from_a_buried_worker_is_not_collected() -> None:
    c = Counters()
    c.hand_over((0, 0), (1, 0))
    publish_answer(c.answers, c.sleeping, 0, 0, 1, 2)
    c.take()
    c.hand_over((0, 0))  # the wake after an answer that came over the pipe (an env restart): not answered yet
    c.answers[0, 0] = 1
    assert c.take() == []
    c.alive[1] = 0
    publish_answer(c.answers, c.sleeping, 1, 0, 1, 2)
    assert c.take() == []
    c.alive[1] = 1
    assert c.take() == [2]


def test_a_worker_takes_its_waiting_groups_in_turn() -> None:
    c = Counters(workers=1, groups=3)
    host, worker = mp.get_context("spawn").Pipe(duplex=True)
    handoff = WorkerHandoff(commands=c.commands, answers=c.answers, sleeping=c.sleeping, worker=0,
                            channel=WorkerEnd(worker))
    order = []
    for _ in range(6):
        c.hand_over(*[(0, g) for g in range(3) if c.commands[0, g] == handoff.taken[g]])
        g = handoff.next_group()
        order.append(g)
        handoff.answer(g)
    assert order == [0, 1, 2, 0, 1, 2]
    host.close()


def test_a_sleeping_worker_wakes_on_the_hosts_nudge_and_quits_on_quit_or_eof() -> None:
    c = Counters(workers=1, groups=2)
    host, worker = mp.get_context("spawn").Pipe(duplex=True)
    host_end = HostEnd(host)
    handoff = WorkerHandoff(commands=c.commands, answers=c.answers, sleeping=c.sleeping, worker=0,
                            channel=WorkerEnd(worker))
    asleep = threading.Event()

    def hand_over_once_asleep() -> None:
        deadline = time.monotonic() + 10
        while not c.sleeping[0] and time.monotonic() < deadline:
            time.sleep(0.001)
        asleep.set()
        time.sleep(0.05)  # still asleep: nothing comes without the nudge
        any_sleeps, _ = c.hand_over((0, 1))
        if any_sleeps:
            host_end.send(WAKE)

    thread = threading.Thread(target=hand_over_once_asleep)
    thread.start()
    assert handoff.next_group() == 1
    thread.join()
    assert asleep.is_set() and c.sleeping[0] == 0
    set_flag(c.sleeping, 1, 1)  # the host sleeps: the answer comes with a nudge on the pipe
    handoff.answer(1)
    assert host_end.read_replies() == [Reply(0, STATUS_NUDGE, b"")]
    host_end.send(WAKE)  # a stale nudge, then QUIT
    host_end.send(QUIT)
    assert handoff.next_group() is None
    host_end.close()
    assert handoff.next_group() is None


def test_a_group_handed_over_while_the_worker_goes_to_sleep_is_taken_without_a_nudge(monkeypatch) -> None:
    """The race the second look covers: the host counts a wake just as the worker sets its flag and does not see
    the flag (its load came first): the worker must find the group before it blocks on a pipe nobody writes."""
    c = Counters(workers=1, groups=2)
    host, worker = mp.get_context("spawn").Pipe(duplex=True)
    handoff = WorkerHandoff(commands=c.commands, answers=c.answers, sleeping=c.sleeping, worker=0,
                            channel=WorkerEnd(worker))

    def flag_then_hand_over(flags: np.ndarray, index: int, value: int) -> None:
        set_flag(flags, index, value)
        if value and index == 0:
            c.commands[0, 1] += 1  # no WAKE: the host read the flag before it was set

    monkeypatch.setattr(handoff_module, "set_flag", flag_then_hand_over)
    got = []
    thread = threading.Thread(target=lambda: got.append(handoff.next_group()))
    thread.start()
    thread.join(timeout=2)
    blocked = thread.is_alive()
    host.close()  # a worker blocked on the pipe sees EOF
    thread.join()
    assert not blocked and got == [1]


FIELDS, SIZE = plan_layout([("commands", (1, 2), "int64"), ("answers", (1, 2), "int64"), ("sleeping", (2,), "int64"),
                            ("steps", (2,), "int64")])


def _random_pause(rng: random.Random) -> None:
    """Nothing, a spin of up to 30 us, or a sleep of up to 2 ms: either side goes to sleep at any moment."""
    kind = rng.random()
    if kind < 0.4:
        started = time.perf_counter()
        while time.perf_counter() - started < rng.random() * 30e-6:
            pass
    elif kind < 0.6:
        time.sleep(rng.random() * 0.002)


def _stepping_worker(conn, name: str, seed: int) -> None:  # conn: a multiprocess Connection
    """Step each group handed over: write its wake count as its step after a random pause, answer."""
    segment = ShmSegment.attach(name, SIZE)
    arrays = segment.views(FIELDS)
    handoff = WorkerHandoff(commands=arrays["commands"], answers=arrays["answers"], sleeping=arrays["sleeping"],
                            worker=0, channel=WorkerEnd(conn))
    rng = random.Random(seed)
    while (g := handoff.next_group()) is not None:
        _random_pause(rng)
        arrays["steps"][g] = handoff.taken[g]
        handoff.answer(g)


@pytest.mark.integration
def test_no_wake_is_lost_and_each_step_is_seen_with_its_answer_across_processes() -> None:
    """A real worker process and this host hand two groups back and forth 3000 times, each side pausing at random
    (so each goes to sleep at arbitrary moments): every answer arrives within 5 s, and the step read after an
    answer is the one written for that wake."""
    context = mp.get_context("spawn")
    segment = ShmSegment.create(segment_name(os.getpid(), "handoff_test"), SIZE)
    arrays = segment.views(FIELDS)
    host, worker = context.Pipe(duplex=True)
    process = context.Process(target=_stepping_worker, args=(worker, segment.name, 7), daemon=True)
    process.start()
    worker.close()
    host_end = HostEnd(host)
    poller = select.poll()
    poller.register(host_end.fd, select.POLLIN)
    c = Counters(workers=1, groups=2)
    c.commands, c.answers, c.sleeping = arrays["commands"], arrays["answers"], arrays["sleeping"]
    rng = random.Random(3)
    try:
        ready = [0, 1]
        for _ in range(3000):
            any_sleeps, _ = c.hand_over(*[(0, g) for g in ready])
            if any_sleeps:
                host_end.send(WAKE)
            _random_pause(rng)
            ready = c.take()
            while not ready:
                set_flag(c.sleeping, 1, 1)
                ready = c.take()
                if not ready:
                    assert poller.poll(5000), "an answer was lost: nothing came within 5 s"
                    assert all(reply.status == STATUS_NUDGE for reply in host_end.read_replies())
                set_flag(c.sleeping, 1, 0)
            for g in ready:
                assert arrays["steps"][g] == c.commands[0, g]
        assert c.commands.sum() >= 3000
    finally:
        host_end.send(QUIT)
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
        host_end.close()
        c = arrays = None
        segment.close()
    assert process.exitcode == 0
    assert not shm_segments(os.getpid())
