"""The byte protocol between the actor host and one env worker over their pipe (a Unix socket pair).

Host -> worker: one byte per command: ``WAKE`` (look at the handoff counters again: a group waits) or ``QUIT``.
Worker -> host: one record per answer: ``[g, status]`` for ``STATUS_OK`` and ``STATUS_NUDGE``; for the other
statuses ``[g, status]``, a 4-byte little-endian length, then that many bytes of an encoded ``EnvErrorReport``.

The hot path does not use the pipe: the host hands out groups and the workers answer through counters in shared
memory (``actors/handoff.py``); a side writes to the pipe only to wake the other from its sleep (``WAKE``,
``STATUS_NUDGE``), to report an env error, or to end.

Both ends call ``os.read``/``os.write`` on the socket's descriptor: one system call per command, and one per batch
of waiting records. (``multiprocess.Connection`` frames each message with a length header: a write, then two reads per
reply, each through several Python calls.) The ``Connection`` objects stay for the pipe's life cycle: spawning
passes the worker its end, and closing one is how the other side sees EOF.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass

from multiprocess.connection import Connection

QUIT = 255
"""The command that ends the worker (group indices are below it)."""
WAKE = 254
"""The command that wakes a sleeping worker to look at its handoff counters."""
MAX_GROUPS = WAKE
"""Groups a worker may have: each command and each record's group is one byte."""
STATUS_OK = 0
STATUS_ENV_RESTARTED = 1
"""An env group raised and was rebuilt; the record carries the error's report."""
STATUS_FATAL = 2
"""The worker cannot go on (its env fails to build or reset); the record carries why."""
STATUS_NUDGE = 3
"""Not an answer: the worker answered through the handoff counters while the host slept (its group byte is 0)."""
READ_BYTES = 1 << 16
"""Most bytes one read takes off the pipe (every reply waiting, in practice)."""
_LENGTH_BYTES = 4
_BARE_STATUSES = (STATUS_OK, STATUS_NUDGE)
"""Statuses whose record is the two bytes alone."""
_COMMANDS = tuple(bytes([c]) for c in range(256))


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer of a worker."""

    group: int
    """The group it answers for."""
    status: int
    """STATUS_OK, STATUS_ENV_RESTARTED or STATUS_FATAL."""
    report: bytes
    """The encoded ``EnvErrorReport`` of an error status (empty for STATUS_OK)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class HostEnd:
    """The host's end of one worker's pipe."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.fd = conn.fileno()
        self.pending = bytearray()
        """Bytes of a record that has not fully arrived yet."""

    def send(self, command: int) -> None:
        """Send one command (a group index, or QUIT); OSError (BrokenPipeError) if the worker is gone."""
        os.write(self.fd, _COMMANDS[command])

    def read_replies(self) -> list[Reply]:
        """Every complete reply waiting (call when the pipe is readable: it blocks otherwise); EOFError once the
        worker closed its end (it exited or died)."""
        data = os.read(self.fd, READ_BYTES)
        if not data:
            raise EOFError("the env worker closed its pipe")
        if not self.pending and len(data) == 2 and data[1] == STATUS_OK:  # the usual case: one step answered
            return [Reply(data[0], STATUS_OK, b"")]
        pending = self.pending
        pending += data
        replies, at = [], 0
        while len(pending) - at >= 2:
            group, status = pending[at], pending[at + 1]
            if status in _BARE_STATUSES:
                replies.append(Reply(group, status, b""))
                at += 2
                continue
            body = at + 2 + _LENGTH_BYTES
            if len(pending) < body:
                break
            size = int.from_bytes(pending[at + 2:body], "little")
            if len(pending) < body + size:
                break
            replies.append(Reply(group, status, bytes(pending[body:body + size])))
            at = body + size
        del pending[:at]
        return replies

    def answer_waiting(self) -> bool:
        """Whether bytes of an answer wait to be read (or part of one was read already)."""
        return bool(self.pending) or bool(select.select([self.fd], [], [], 0)[0])

    def close(self) -> None:
        self.conn.close()


class WorkerEnd:
    """The worker's end of its pipe."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.fd = conn.fileno()
        self.commands = b""
        """Commands read but not yet taken (the host may wake two groups before the worker reads)."""
        self.next = 0

    def next_command(self) -> int | None:
        """The host's next command, waiting for it; None once the host closed its end (or the pipe broke)."""
        if self.next == len(self.commands):
            try:
                self.commands = os.read(self.fd, READ_BYTES)
            except OSError:
                return None
            self.next = 0
            if not self.commands:
                return None
        command = self.commands[self.next]
        self.next += 1
        return command

    def reply(self, group: int, status: int, report: bytes = b"") -> None:
        """Answer for ``group``; OSError if the host is gone."""
        if status in _BARE_STATUSES:
            os.write(self.fd, _COMMANDS[group] + _COMMANDS[status])
        else:
            _write_all(self.fd, bytes([group, status]) + len(report).to_bytes(_LENGTH_BYTES, "little") + report)
