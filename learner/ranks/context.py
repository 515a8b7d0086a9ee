"""One learner rank of a data-parallel run under torchrun (issue 15): who it is, its process group, its notice board,
and where its data socket listens.

``join_ranks`` runs first in every rank: it opens torchrun's store (learner/ranks/store.py), joins the gloo/NCCL
process group through it (learner/ranks/distributed.py), and writes the rank's process (host name, pid) and its data
endpoint on the board. Rank 0 reads every rank's endpoint to route actor hosts (learner/serve/host_routing.py).

Ports: rank 0 binds network.port (control), + 1 (data), + 2 (weights) and its metrics port (+ 3 by default), as a
single learner does; rank r >= 1 binds only a data socket, at network.port + 3 + r. A rank on rank 0's machine
binds network.host; one on another machine binds every interface of its own (its data endpoint is then announced
under SLUICE_ADVERTISE_HOST, or its host name).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from learner.ranks.distributed import DEFAULT_TIMEOUT, ProcessGroupReducer, close_learner_group, init_learner_group
from learner.ranks.store import RankStore, open_store
from protocol.endpoints import Endpoint
from protocol.same_machine import IpcRoute

ADVERTISE_HOST = "SLUICE_ADVERTISE_HOST"
"""Environment variable: the address actor hosts reach a rank on another machine than rank 0 at."""
SAME_HOST = "*"
"""An announced data endpoint's host meaning "the machine you reach the learner's control socket on"."""
FACTS_TIMEOUT = datetime.timedelta(seconds=120)
"""How long rank 0 waits for every rank to announce itself after joining the group."""


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """This process's place among the learner ranks."""

    rank: int
    """This rank (0 owns control, weights, checkpoints, metrics and the pool)."""
    world_size: int
    """Learner ranks K."""
    reducer: ProcessGroupReducer
    """The process group's collectives, as ppo_update takes them."""
    board: RankStore
    """The ranks' shared store."""
    host_name: str
    """This machine's host name."""

    @property
    def is_leader(self) -> bool:
        """Rank 0."""
        return self.rank == 0

    def process_of(self, rank: int) -> tuple[str, int] | None:
        """(host name, pid) that ``rank`` announced, None before it did."""
        text = self.board.text("process", rank)
        if text is None:
            return None
        host, _, pid = text.rpartition(" ")
        return host, int(pid)


def join_ranks(device: torch.device, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> RankContext:
    """Join the learner ranks torchrun started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = open_store(rank=rank)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    reducer = init_learner_group(device, timeout=timeout, store=dist.PrefixStore(f"sluice/{attempt}/pg", store),
                                 rank=rank, world_size=world_size)
    board = RankStore(store=store, prefix=f"sluice/{attempt}/")
    host_name = socket.gethostname()
    board.set_text("process", rank, f"{host_name} {os.getpid()}")
    return RankContext(rank=rank, world_size=world_size, reducer=reducer, board=board, host_name=host_name)


def leave_ranks(*, broken: bool, exit_code: int) -> None:
    """Leave the process group at the end of a rank's run; after a rank failure (collectives still pending, which
    can abort the interpreter's exit) end the process now with ``exit_code``, its output flushed."""
    if broken:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    close_learner_group()


def data_port(network_port: int, rank: int) -> int:
    """The port rank ``rank``'s data socket binds: network.port + 1 for rank 0, network.port + 3 + rank beyond."""
    return network_port + 1 if rank == 0 else network_port + 3 + rank


def leader_host(ranks: RankContext) -> str:
    """The host name of rank 0's machine (waits for rank 0 to announce itself)."""
    if ranks.is_leader:
        return ranks.host_name
    return ranks.board.wait_text("process", 0, FACTS_TIMEOUT).rpartition(" ")[0]


def rank_data_binding(control: Endpoint, ranks: RankContext) -> Endpoint:
    """Where this rank's data socket binds: network.host on rank 0's machine, every interface on another (ValueError
    when network.host is loopback there: actor hosts could not reach this rank)."""
    port = data_port(control.port, ranks.rank)
    leader = leader_host(ranks)
    if leader == ranks.host_name:
        return control.with_port(port)
    if control.is_loopback:
        raise ValueError(f"learner rank {ranks.rank} runs on {ranks.host_name}, not on rank 0's machine {leader}, "
                         f"but network.host {control.host} is loopback: actor hosts could not reach this rank; set "
                         "network.host to an address of rank 0's machine")
    return Endpoint(scheme="tcp", host="*", port=port)


def announce_endpoint(binding: Endpoint, ranks: RankContext) -> None:
    """Write the data endpoint rank 0 tells actor hosts for this rank: ``tcp://*:PORT`` on rank 0's machine (the
    hosts use the learner's address), else this machine's advertised address."""
    if ranks.host_name == leader_host(ranks):
        announced = f"tcp://{SAME_HOST}:{binding.port}"
    else:
        announced = f"tcp://{os.environ.get(ADVERTISE_HOST) or socket.getfqdn()}:{binding.port}"
    ranks.board.set_text("endpoint", ranks.rank, announced)


def announce_ipc(route: IpcRoute | None, ranks: RankContext) -> None:
    """Write where this rank's data socket also listens for actor hosts on its machine ("" : nowhere); before
    ``announce_endpoint``, so rank 0 finds it once it has the endpoint."""
    ranks.board.set_text("ipc", ranks.rank, "" if route is None else json.dumps(route.to_field()))


def gather_ipc_routes(ranks: RankContext, endpoints: list[str]) -> dict[str, dict[str, str]]:
    """Rank 0, after ``gather_endpoints``: the other ranks' ipc routes by their announced data endpoint (REGISTERED's
    ``data_ipc``); a rank that announced none (or an unreadable one) is left out, and hosts reach it over TCP."""
    routes: dict[str, dict[str, str]] = {}
    for rank in range(1, ranks.world_size):
        text = ranks.board.text("ipc", rank)
        try:
            route = IpcRoute.from_field(json.loads(text)) if text else None
        except ValueError:
            route = None
        if route is not None:
            routes[endpoints[rank]] = route.to_field()
    return routes


def gather_endpoints(ranks: RankContext) -> list[str]:
    """Rank 0: every rank's announced data endpoint, in rank order (waits for each)."""
    return [ranks.board.wait_text("endpoint", rank, FACTS_TIMEOUT) for rank in range(ranks.world_size)]
