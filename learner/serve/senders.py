"""Who may send rows: the registered actor hosts, by the token the control server handed each registration.

The control thread adds a sender when a host registers and removes it when the host says BYE or goes silent;
the ingest thread looks each ROWS message's token up here and drops rows from anyone else. With CURVE the
sender also carries the public key its registration came with, and rows must arrive under the same key.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Sender:
    """One registration of an actor host, as the data socket checks it."""

    name: str
    """The host's name as it registered (for logs)."""
    token: str
    """The secret handed to this registration (REGISTERED.token), sent back in every ROWS message."""
    curve_key: str | None
    """The z85 CURVE public key the registration arrived under, None without CURVE."""
    num_envs: int
    """Environments the host runs (its workers times envs per worker)."""
    agent_slots: int
    """Agents the host steps at once (num_envs times agents per env)."""


def new_token() -> str:
    """A fresh unguessable registration token (128 bits, hex)."""
    return secrets.token_hex(16)


class SenderRegistry:
    """Thread-safe map token -> Sender, shared by the control server (writes) and the ingest (reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._senders: dict[str, Sender] = {}
        self._changes = 0

    def add(self, sender: Sender) -> None:
        """A host registered (the control server removes a re-registering host's old token first)."""
        with self._lock:
            self._senders[sender.token] = sender
            self._changes += 1

    def remove(self, token: str) -> Sender | None:
        """A host left or was forgotten; its rows are dropped from now on."""
        with self._lock:
            self._changes += 1
            return self._senders.pop(token, None)

    def snapshot(self) -> tuple[int, list[Sender]]:
        """How many changes the registry has seen, and its senders now (a learner rank copies them to the others)."""
        with self._lock:
            return self._changes, list(self._senders.values())

    def replace_all(self, senders: list[Sender]) -> None:
        """Hold exactly ``senders`` (a follower learner rank taking rank 0's registered hosts)."""
        with self._lock:
            self._senders = {sender.token: sender for sender in senders}
            self._changes += 1

    def get(self, token: object) -> Sender | None:
        """The registered sender holding ``token`` (None for anything else, including a non-string)."""
        if not isinstance(token, str):
            return None
        with self._lock:
            return self._senders.get(token)

    def __len__(self) -> int:
        with self._lock:
            return len(self._senders)
