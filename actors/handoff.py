"""The hot path's handoff of env groups between the actor host and its workers: counters in shared memory, and a
pipe byte only to a side that sleeps.

Per group ``(w, g)``: ``commands[w, g]`` counts the host's wakes (it writes the group's actions first);
``answers[w, g]`` is the wake the worker last answered with a step (it writes the step first). ``sleeping[w]``
says worker ``w`` is about to block on its pipe; ``sleeping[workers]`` says the host is about to block in its poll.

A side that publishes a counter then reads the other side's sleeping flag, and nudges it over the pipe only if it
sleeps. A side that goes to sleep sets its flag, then looks at the counters once more before it blocks. A full
fence stands between each side's store and its load. So, as in Dekker's algorithm, either the sleeper sees the new
counter or the publisher sees the flag: no wake is lost, and neither side makes a system call while the other is
awake. The fences (protocol/memory_fence.py) are LLVM ``fence seq_cst``. They also order the data:
whoever sees a counter also sees the actions or the step written before it.

Only steps that went well travel this way. An env error, a restart or a fatal report still goes over the pipe as a
record (``actors/worker_channel.py``), and so do the build's first answers, QUIT and a dead worker's EOF.
"""

from __future__ import annotations

import numba
import numpy as np

from actors.worker_channel import QUIT, STATUS_NUDGE, WorkerEnd
from protocol.memory_fence import fence as _full_fence

SPIN_CHECKS = 2000
"""How many times a worker with no group to step looks at its counters before it goes to sleep on its pipe (a few
microseconds: the host often hands the next group out in that time, and a longer spin takes the CPU from the host
on a small machine)."""


@numba.njit(cache=True, nogil=True)
def set_flag(flags: np.ndarray, index: int, value: int) -> None:
    """``flags[index] = value``, then a full fence (a sleeper's flag is set before it looks once more)."""
    flags[index] = value
    _full_fence()


@numba.njit(cache=True, nogil=True)
def publish_commands(commands: np.ndarray, sleeping: np.ndarray, workers: np.ndarray, groups: np.ndarray,
                     nudge: np.ndarray) -> bool:
    """The host hands out groups ``(workers[k], groups[k])``: count each one's wake, then ``nudge[k]`` says whether
    that worker sleeps (the host must write to its pipe); whether any does."""
    _full_fence()  # the actions written before are seen by whoever sees the counter
    for k in range(len(workers)):
        commands[workers[k], groups[k]] += 1
    _full_fence()
    any_sleeps = False
    for k in range(len(workers)):
        nudge[k] = sleeping[workers[k]] != 0
        any_sleeps |= nudge[k]
    return any_sleeps


@numba.njit(cache=True, nogil=True)
def take_answers(commands: np.ndarray, answers: np.ndarray, seen: np.ndarray, alive: np.ndarray,
                 out: np.ndarray) -> int:
    """The host collects the groups whose answer to their latest wake came in since it last looked: their flat ids
    ``w * groups + g`` go to ``out`` in worker order; returns how many. Workers not ``alive`` are skipped."""
    workers, groups = commands.shape
    n = 0
    for w in range(workers):
        if not alive[w]:
            continue
        for g in range(groups):
            wake = commands[w, g]
            if answers[w, g] == wake and seen[w, g] != wake:
                seen[w, g] = wake
                out[n] = w * groups + g
                n += 1
    if n:
        _full_fence()  # the steps are read after their counters
    return n


@numba.njit(cache=True, nogil=True)
def next_group(commands: np.ndarray, taken: np.ndarray, worker: int, start: int, checks: int) -> int:
    """A worker looks for a group the host handed it and it has not taken, up to ``checks`` passes, from group
    ``start`` on; takes it and returns its index, or -1."""
    groups = len(taken)
    for _ in range(checks):
        for k in range(groups):
            g = (start + k) % groups
            wake = commands[worker, g]
            if wake != taken[g]:
                taken[g] = wake
                _full_fence()  # its actions are read after its counter
                return g
    return -1


@numba.njit(cache=True, nogil=True)
def publish_answer(answers: np.ndarray, sleeping: np.ndarray, worker: int, group: int, wake: int,
                   host: int) -> bool:
    """A worker answers ``wake`` of its ``group`` (its step is written); whether the host sleeps (the worker must
    write to its pipe)."""
    _full_fence()
    answers[worker, group] = wake
    _full_fence()
    return sleeping[host] != 0


class WorkerHandoff:
    """A worker's side of the handoff: its row of the counters and its pipe."""

    def __init__(self, *, commands: np.ndarray, answers: np.ndarray, sleeping: np.ndarray, worker: int,
                 channel: WorkerEnd) -> None:
        self.commands, self.answers, self.sleeping = commands, answers, sleeping
        self.worker = worker
        self.host = len(sleeping) - 1
        """The host's index in ``sleeping``."""
        self.channel = channel
        self.taken = np.zeros(commands.shape[1], dtype=np.int64)
        """The wake of each group this worker took last."""
        self.start = 0
        """Where the next look starts (the group after the last one taken: every group gets its turn)."""
        set_flag(sleeping, worker, 0)  # loads the compiled code now (and what numba loads with it: a BLAS)
        next_group(commands, self.taken, worker, 0, 0)

    def next_group(self) -> int | None:
        """The next group to step, waiting for one: spin a little, then sleep on the pipe until the host's nudge;
        None on QUIT or once the host is gone."""
        g = next_group(self.commands, self.taken, self.worker, self.start, SPIN_CHECKS)
        if g < 0:
            g = self._sleep()
        if g is not None:
            self.start = g + 1
        return g

    def answer(self, group: int) -> None:
        """Tell the host ``group``'s step is written (nudging it if it sleeps); OSError if the host is gone."""
        if publish_answer(self.answers, self.sleeping, self.worker, group, int(self.taken[group]), self.host):
            self.channel.reply(0, STATUS_NUDGE)

    def _sleep(self) -> int | None:
        """Set the sleeping flag, then look once more before each block on the pipe (a ``WAKE`` may be stale: look
        again); the group, or None on QUIT or EOF. The flag is cleared on the way out."""
        set_flag(self.sleeping, self.worker, 1)
        try:
            while True:
                g = next_group(self.commands, self.taken, self.worker, self.start, 1)
                if g >= 0:
                    return g
                command = self.channel.next_command()
                if command is None or command == QUIT:
                    return None
        finally:
            set_flag(self.sleeping, self.worker, 0)
