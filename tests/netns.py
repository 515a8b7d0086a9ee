"""Two test hosts on one machine: Linux network namespaces joined by a veth pair (needs root and iproute2).

The test creates its own namespaces, link and addresses (10.201.N.0/24, N from the test's pid) and removes them
whatever happens. Processes start inside a namespace with ``ip netns exec``, which execs the command, so the
Popen's pid is the process itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.processes import REPO

IP = shutil.which("ip") or "/usr/sbin/ip"
NFT = shutil.which("nft") or "/usr/sbin/nft"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], check=check, capture_output=True, text=True)


def missing_requirements() -> str | None:
    """Why two namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if not Path(IP).exists():
        return "iproute2's ip is missing (bash ops/setup.sh installs it as root)"
    return None


class NamespacePair:
    """Namespaces ``learner_ns`` (address ``learner_ip``) and ``host_ns`` (``host_ip``) over veth ``learner_dev``."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.learner_ns, self.host_ns = f"sl{tag}L", f"sl{tag}H"
        self.learner_dev, self.host_dev = f"slv{tag}L", f"slv{tag}H"
        subnet = 10 + os.getpid() % 240
        self.learner_ip, self.host_ip = f"10.201.{subnet}.1", f"10.201.{subnet}.2"
        try:
            for ns in (self.learner_ns, self.host_ns):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", self.learner_dev, "type", "veth", "peer", "name", self.host_dev)
            for dev, ns, address in ((self.learner_dev, self.learner_ns, self.learner_ip),
                                     (self.host_dev, self.host_ns, self.host_ip)):
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
        except BaseException:
            self.remove()
            raise

    def start(self, ns: str, argv: list[str], *, log: Path) -> subprocess.Popen:
        """``argv`` inside namespace ``ns`` (a new session), stdout and stderr to ``log``."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen([IP, "netns", "exec", ns, *argv], cwd=REPO, stdout=log.open("w"),
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def python(self, ns: str, module: str, *args: str, log: Path) -> subprocess.Popen:
        """``python -m module args`` inside ``ns``."""
        return self.start(ns, [sys.executable, "-m", module, *args], log=log)

    def shape_host_link(self) -> str:
        """Make the actor host's side a slow, lossy link: netem delay and loss where the kernel has netem, else a
        token-bucket rate limit (tbf); returns what was applied."""
        netem = _ip("netns", "exec", self.host_ns, "tc", "qdisc", "add", "dev", self.host_dev, "root", "netem",
                    "delay", "40ms", "10ms", "loss", "1%", "rate", "20mbit", check=False)
        if netem.returncode == 0:
            return "netem delay 40ms +-10ms, loss 1%, rate 20mbit"
        _ip("netns", "exec", self.host_ns, "tc", "qdisc", "add", "dev", self.host_dev, "root", "tbf", "rate", "8mbit",
            "burst", "32kbit", "latency", "200ms")
        return "tbf rate 8mbit (this kernel has no netem)"

    def partition(self) -> None:
        """Cut the link both ways without closing anything: nftables drops every packet the host namespace sends to
        or gets from the learner's address (open TCP connections stay open and retransmit, as in a real partition)."""
        rules = (f"table inet sluice_partition {{\n"
                 f"  chain out {{\n    type filter hook output priority 0; policy accept;\n"
                 f"    ip daddr {self.learner_ip} drop\n  }}\n"
                 f"  chain in {{\n    type filter hook input priority 0; policy accept;\n"
                 f"    ip saddr {self.learner_ip} drop\n  }}\n}}\n")
        subprocess.run([IP, "netns", "exec", self.host_ns, NFT, "-f", "-"], input=rules, text=True, check=True,
                       capture_output=True)

    def heal(self) -> None:
        """Undo ``partition``."""
        _ip("netns", "exec", self.host_ns, NFT, "delete", "table", "inet", "sluice_partition", check=False)

    def remove(self) -> None:
        """Delete both namespaces (their veth ends go with them); idempotent."""
        for ns in (self.learner_ns, self.host_ns):
            _ip("netns", "del", ns, check=False)
