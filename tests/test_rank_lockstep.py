"""The learner ranks' lockstep (learner/ranks/lockstep.py) over a real c10d HashStore: rank 0 waits for the followers,
merges their reports and decides; a follower marks ready, asks to stop, and reads the decision."""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass, field

import pytest
import torch.distributed as dist

from learner.ranks.distributed import ProcessGroupReducer
from learner.serve.host_routing import HostRouting
from learner.serve.ingest_counters import IngestCounters, IngestDelta
from learner.ranks.lockstep import (BEHIND_UPDATES, FollowerLockstep, LeaderLockstep, RankWaits, rank_wait_metrics)
from learner.ranks.store import STOP_PREFIX, UPDATE, RankStore
from learner.ranks.context import RankContext

JOIN_S = 10.0
"""Longest a test waits for its other thread (a failure, not a timing)."""


@dataclass
class StubLink:
    """What the lockstep asks of learner.ranks.link.RankLink."""

    gone_lines: list[str] = field(default_factory=list)
    """What ``gone()`` answers."""

    def gone(self) -> list[str]:
        return list(self.gone_lines)

    def fills(self) -> dict[int, float]:
        return {}


@dataclass
class StopRequests:
    """Records ``request_stop(reason, exit_code=...)`` calls."""

    calls: list[tuple[str, int]] = field(default_factory=list)
    """(reason, exit_code) of each call."""

    def __call__(self, reason: str, exit_code: int = 0) -> None:
        self.calls.append((reason, exit_code))


def _context(board: RankStore, rank: int) -> RankContext:
    reducer = ProcessGroupReducer(rank=rank, world_size=2, timeout=datetime.timedelta(seconds=5))
    return RankContext(rank=rank, world_size=2, reducer=reducer, board=board, host_name="test")


@dataclass
class Pair:
    """Rank 0's and rank 1's lockstep over one store."""

    leader: LeaderLockstep
    follower: FollowerLockstep
    link: StubLink
    counters: IngestCounters
    routing: HostRouting
    announced: list[str]


def _pair(routing: HostRouting | None = None) -> Pair:
    board = RankStore(store=dist.HashStore())
    link, counters, announced = StubLink(), IngestCounters(), []
    routing = routing or HostRouting(["tcp://*:1", "tcp://*:2"])
    leader = LeaderLockstep(_context(board, 0), link, counters=counters, routing=routing, announce=announced.append,
                            observe_fills=lambda fills: None)
    return Pair(leader=leader, follower=FollowerLockstep(_context(board, 1), link), link=link, counters=counters,
                routing=routing, announced=announced)


def _in_thread(target, *args, **kwargs) -> tuple[threading.Thread, dict[str, object]]:
    result: dict[str, object] = {}

    def run() -> None:
        result["value"] = target(*args, **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_leader_waits_for_the_followers_report_then_both_run_the_update() -> None:
    pair = _pair()
    requests = StopRequests()
    waiting, waits = _in_thread(pair.leader.wait_for_followers, 7, stop=threading.Event(), request_stop=requests,
                                own_wait_s=0.25)
    report = IngestDelta(rows_wait_s=1.5, env_steps=40, agent_steps=80, episodes=2, returns=[1.0, 3.0],
                         lengths=[5, 6], rows_received=64, lag_sum=4, lag_max=2, lag_rows=4)
    pair.follower.ready(7, report)
    waiting.join(JOIN_S)
    assert not waiting.is_alive()
    result = waits["value"]
    assert isinstance(result, RankWaits)
    assert result.rows_wait_s == {0: 0.25, 1: 1.5}
    assert result.followers_wait_s >= 0
    totals = pair.counters.totals()
    assert (totals.env_steps, totals.agent_steps, totals.episodes) == (40, 80, 2)
    assert list(pair.counters.take_snapshot().recent_returns) == [1.0, 3.0]
    assert (totals.rows_received, totals.lag_sum, totals.lag_max, totals.lag_rows) == (64, 4, 2, 4)
    assert requests.calls == []

    deciding, decision = _in_thread(pair.follower.wait_decision, 7, local_stop=lambda: None)
    pair.leader.go(7)
    deciding.join(JOIN_S)
    assert decision["value"] == UPDATE
    assert pair.follower.stop_decided(7) is None


def test_end_is_a_stop_decision_with_the_reason() -> None:
    pair = _pair()
    assert pair.follower.stop_decided(3) is None
    pair.leader.end(3, "total_timesteps reached")
    assert pair.follower.stop_decided(3) == "total_timesteps reached"
    assert pair.follower.wait_decision(3, local_stop=lambda: None) == STOP_PREFIX + "total_timesteps reached"
    assert pair.follower.stop_decided(4) is None


def test_a_followers_stop_request_reaches_rank_zero_once() -> None:
    pair = _pair()
    requests = StopRequests()
    pair.leader.last_check = 0
    pair.leader.check_followers(requests)
    assert requests.calls == []
    pair.follower.ask_stop("SIGTERM")
    pair.follower.ask_stop("a second reason")
    pair.leader.last_check = 0
    pair.leader.check_followers(requests)
    assert requests.calls == [("learner rank 1: SIGTERM", 0)]


def test_a_local_stop_while_waiting_for_the_decision_asks_rank_zero() -> None:
    pair = _pair()
    deciding, decision = _in_thread(pair.follower.wait_decision, 2, local_stop=lambda: "SIGINT")
    requests = StopRequests()
    for _ in range(1000):
        pair.leader.last_check = 0
        pair.leader.check_followers(requests)
        if requests.calls:
            break
        threading.Event().wait(0.005)
    assert requests.calls == [("learner rank 1: SIGINT", 0)]
    pair.leader.end(2, "learner rank 1: SIGINT")
    deciding.join(JOIN_S)
    assert decision["value"] == STOP_PREFIX + "learner rank 1: SIGINT"


def test_check_followers_looks_at_most_every_check_interval() -> None:
    pair = _pair()
    requests = StopRequests()
    pair.leader.last_check = 0
    pair.leader.check_followers(requests)
    pair.follower.ask_stop("late")
    pair.leader.check_followers(requests)
    assert requests.calls == [], "checked again right away"


def test_a_gone_rank_stops_the_run_with_exit_code_one() -> None:
    pair = _pair()
    pair.link.gone_lines = ["learner rank 1 (pid 4242) has ended"]
    pair.follower.ask_stop("ignored: gone comes first")
    requests = StopRequests()
    pair.leader.last_check = 0
    pair.leader.check_followers(requests)
    assert requests.calls == [("learner rank 1 (pid 4242) has ended", 1)]


def test_a_gone_rank_ends_the_wait_for_followers_through_the_stop_event() -> None:
    pair = _pair()
    pair.link.gone_lines = ["rank 1 is silent", "rank 2 too"]
    stop = threading.Event()

    def request_stop(reason: str, exit_code: int = 0) -> None:
        assert (reason, exit_code) == ("rank 1 is silent; rank 2 too", 1)
        stop.set()

    pair.leader.last_check = 0
    waiting, waits = _in_thread(pair.leader.wait_for_followers, 1, stop=stop, request_stop=request_stop,
                                own_wait_s=0.0)
    waiting.join(JOIN_S)
    assert not waiting.is_alive()
    assert waits["value"] is None
    assert stop.is_set()


def test_a_stop_set_while_the_leader_waits_returns_none() -> None:
    pair = _pair()
    stop = threading.Event()
    waiting, waits = _in_thread(pair.leader.wait_for_followers, 5, stop=stop, request_stop=StopRequests(),
                                own_wait_s=0.0)
    stop.set()
    waiting.join(JOIN_S)
    assert not waiting.is_alive()
    assert waits["value"] is None
    assert pair.counters.totals().env_steps == 0


def test_a_gone_leader_ends_the_followers_wait_for_a_decision() -> None:
    pair = _pair()
    pair.link.gone_lines = ["learner rank 0 is silent"]
    deciding, decision = _in_thread(pair.follower.wait_decision, 9, local_stop=lambda: None)
    deciding.join(JOIN_S)
    assert decision["value"] == STOP_PREFIX + "learner rank 0 is silent"


def test_rank_wait_metrics_keys() -> None:
    waits = RankWaits(rows_wait_s={1: 0.5, 0: 0.25, 2: 1.0}, followers_wait_s=0.75)
    assert rank_wait_metrics(waits) == {"rank0_rows_wait_s": 0.25, "rank1_rows_wait_s": 0.5,
                                        "rank2_rows_wait_s": 1.0, "ranks_wait_s": 0.75}
    assert list(rank_wait_metrics(waits))[:3] == ["rank0_rows_wait_s", "rank1_rows_wait_s", "rank2_rows_wait_s"]
    assert rank_wait_metrics(RankWaits(rows_wait_s={0: 0.5}, followers_wait_s=0.0)) == {}


def _routing_with_two_hosts_on_rank_zero() -> HostRouting:
    """K=2: a (6 agents) and c (2 agents) on rank 0, b (6 agents) on rank 1."""
    routing = HostRouting(["tcp://*:1", "tcp://*:2"])
    routing.add("a", 6)
    routing.add("b", 6)
    routing.add("c", 2)
    assert [routing.ranks_of(host) for host in "abc"] == [(0,), (1,), (0,)]
    return routing


def test_a_rank_that_keeps_waiting_for_rows_gets_a_host() -> None:
    pair = _pair(_routing_with_two_hosts_on_rank_zero())
    for _ in range(BEHIND_UPDATES - 1):
        pair.leader._relieve_behind({0: 0.0, 1: 1.0})
    assert pair.routing.ranks_of("c") == (0,)
    assert pair.announced == []
    pair.leader._relieve_behind({0: 0.0, 1: 1.0})
    assert pair.routing.ranks_of("c") == (1,), "the smallest host of the rank that waited least moves"
    assert pair.routing.ranks_of("a") == (0,)
    assert pair.routing.moves == 1
    assert len(pair.announced) == 1
    assert pair.announced[0].startswith("learner rank 1 keeps waiting for rows (1.00 s against 0.00 s on rank 0)")
    assert pair.leader.behind == (-1, 0)


@pytest.mark.parametrize("waits", [{0: 0.0, 1: 0.04}, {0: 0.6, 1: 1.0}])
def test_a_small_or_relative_small_gap_is_not_falling_behind(waits: dict[int, float]) -> None:
    pair = _pair(_routing_with_two_hosts_on_rank_zero())
    for _ in range(BEHIND_UPDATES + 2):
        pair.leader._relieve_behind(waits)
    assert pair.routing.moves == 0
    assert pair.announced == []


def test_falling_behind_must_be_in_a_row_on_the_same_rank() -> None:
    pair = _pair(_routing_with_two_hosts_on_rank_zero())
    for waits in ({0: 0.0, 1: 1.0}, {0: 0.0, 1: 1.0}, {0: 0.0, 1: 0.0}, {0: 0.0, 1: 1.0}, {0: 0.0, 1: 1.0}):
        pair.leader._relieve_behind(waits)
    assert pair.routing.moves == 0
    pair.leader._relieve_behind({0: 0.0, 1: 1.0})
    assert pair.routing.moves == 1
