"""Rows over ``ipc://`` when an actor host runs on its learner's machine: a unix socket costs the two ends about half
the CPU per message that TCP over loopback does (3 MB messages: 0.55-1.05 ms against 1.5-1.8 ms).

Each learner rank's data (PULL) socket binds, besides its TCP endpoint, ``ipc:///tmp/sluice_<pid>_data<rank>`` (the
same socket, so CURVE and ZAP apply alike; ``bind_ipc``), and REGISTERED's ``data_ipc`` maps each TCP data endpoint
it names (``data_endpoint``, every ``data_endpoints`` entry) to that rank's ``IpcRoute``: the ipc endpoint, the
rank's ``machine_identity`` and the identity of the socket file it bound. A host connects its data socket there
instead of over TCP only when ``usable_ipc`` says the file is that learner's and reachable from here: the same boot
of the same machine in the same network namespace (a host in another namespace counts as elsewhere on purpose: the
two-host tests cut TCP between namespaces), the very socket file the learner bound (another mount namespace may show
another /tmp, or none), writable by this user. Anything else keeps TCP, as does a learner that announces no route (an
older one, or one with ``network.same_machine_ipc: false``).

libzmq (4.3) unlinks a path before it binds it, but not when the socket closes: the learner removes its file when its
data socket closes (``remove_ipc_file``; at exit too), and ``remove_stale_ipc_files`` removes those of learners that
died without doing so.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from protocol.endpoints import parse_endpoint

LOG = logging.getLogger("sluice.protocol.same_machine")
IPC_DIR = Path("/tmp")
"""Where the data sockets' files go: a short path (a unix socket path holds at most 107 bytes) on every Linux."""
IPC_NAME = re.compile(r"^sluice_(\d+)_data\d+$")
"""A data socket file's name: the owner's pid and the learner rank."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""A random id the kernel picks at every boot."""
NET_NAMESPACE = Path("/proc/self/ns/net")
"""This process's network namespace; its inode tells namespaces apart."""
ROUTE_KEYS = ("endpoint", "machine", "file")
"""The keys of a ``data_ipc`` route."""
MAX_ROUTES = 1025
"""Most entries a host reads from ``data_ipc`` (one per learner rank, plus ``data_endpoint``)."""


def data_ipc_path(owner_pid: int, rank: int, directory: Path = IPC_DIR) -> Path:
    """sluice_<pid>_data<rank>: the owner's pid in the name makes a stale file findable."""
    return directory / f"sluice_{owner_pid}_data{rank}"


def machine_identity() -> str | None:
    """This boot of this machine and this process's network namespace, ``<boot_id>/net:<inode>``; None where /proc
    does not tell (not Linux)."""
    try:
        boot = BOOT_ID.read_text().strip()
        net = os.stat(NET_NAMESPACE).st_ino
    except OSError:
        return None
    return f"{boot}/net:{net}" if boot else None


def file_identity(path: str | os.PathLike) -> str | None:
    """``<device>:<inode>`` of the unix socket file at ``path``; None when there is none (or it is no socket)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return f"{status.st_dev}:{status.st_ino}" if stat.S_ISSOCK(status.st_mode) else None


@dataclass(frozen=True, kw_only=True)
class IpcRoute:
    """Where a learner rank's data socket also listens, and what tells a host it can reach it."""

    endpoint: str
    """``ipc://PATH``."""
    machine: str
    """The learner rank's ``machine_identity``."""
    file: str
    """The ``file_identity`` of the socket file the rank bound."""

    @property
    def path(self) -> str:
        """The socket file's path."""
        return self.endpoint.removeprefix("ipc://")

    def to_field(self) -> dict[str, str]:
        """As a ``data_ipc`` value."""
        return {"endpoint": self.endpoint, "machine": self.machine, "file": self.file}

    @classmethod
    def from_field(cls, value: Any) -> IpcRoute | None:
        """A ``data_ipc`` value as a route; None when malformed."""
        if not isinstance(value, dict) or not all(isinstance(value.get(key), str) for key in ROUTE_KEYS):
            return None
        if not value["endpoint"].startswith("ipc:///"):
            return None
        return cls(endpoint=value["endpoint"], machine=value["machine"], file=value["file"])


def usable_ipc(route: IpcRoute, *, machine: str | None) -> bool:
    """The decision: whether a process whose ``machine_identity`` is ``machine`` reaches ``route``'s learner over its
    unix socket (same boot, same network namespace, the very file the learner bound, writable by this user)."""
    return (machine is not None and route.machine == machine and file_identity(route.path) == route.file
            and os.access(route.path, os.W_OK))


def ipc_routes(value: Any, *, machine: str | None) -> dict[str, str]:
    """REGISTERED's ``data_ipc`` as {TCP data endpoint as announced: ipc endpoint}, only the routes ``usable_ipc``
    allows; a malformed field is logged and gives none."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ROUTES:
        LOG.warning("learner sent a data_ipc field that is not a map of at most %d routes; rows go over TCP",
                    MAX_ROUTES)
        return {}
    routes: dict[str, str] = {}
    for url, field in value.items():
        route = IpcRoute.from_field(field)
        try:
            announced = parse_endpoint(url, "data endpoint").url
        except (TypeError, ValueError):
            route = None
        if route is None:
            LOG.warning("learner sent a bad data_ipc route for %.80r; rows go there over TCP", url)
        elif usable_ipc(route, machine=machine):
            routes[announced] = route.endpoint
    return routes


def owned_by_this_user(endpoint: str) -> bool:
    """Whether the unix socket file of ipc endpoint ``endpoint`` is this process's user's. A learner reads a rows
    segment only of its own user (protocol/shared_rows.py), so a host of another user (root beside a user's learner)
    sends its rows in the messages."""
    try:
        return os.stat(endpoint.removeprefix("ipc://")).st_uid == os.geteuid()
    except OSError:
        return False


def bind_ipc(socket: zmq.Socket, path: Path) -> IpcRoute | None:
    """Bind ``socket`` also at ``ipc://path`` (after removing stale files of dead learners), and remove the file at
    exit if it is still there; None (logged) where this machine cannot say who it is or the bind fails: hosts then
    send over TCP."""
    machine = machine_identity()
    if machine is None:
        return None
    remove_stale_ipc_files(path.parent)
    endpoint = f"ipc://{path}"
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as err:
        LOG.warning("cannot bind %s (%s): actor hosts on this machine send rows over TCP", endpoint, err.strerror)
        return None
    file = file_identity(path)
    if file is None:  # removed at once by someone else
        LOG.warning("the socket file of %s is gone: actor hosts on this machine send rows over TCP", endpoint)
        return None
    route = IpcRoute(endpoint=endpoint, machine=machine, file=file)
    atexit.register(remove_ipc_file, route)
    return route


def remove_ipc_file(route: IpcRoute) -> None:
    """Remove the socket file ``route`` names if it is still the one bound there (libzmq leaves it on close)."""
    if file_identity(route.path) == route.file:
        try:
            os.unlink(route.path)
        except FileNotFoundError:
            pass


def remove_stale_ipc_files(directory: Path = IPC_DIR) -> list[Path]:
    """Remove the data socket files in ``directory`` whose owner process no longer exists; returns them."""
    removed: list[Path] = []
    try:
        candidates = list(directory.glob("sluice_*_data*"))
    except OSError:
        return removed
    for path in candidates:
        match = IPC_NAME.match(path.name)
        if match is None or file_identity(path) is None or owner_alive(int(match.group(1))):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def owner_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a file named after it is not stale)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
