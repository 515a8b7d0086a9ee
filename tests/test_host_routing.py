"""HostRouting (learner/serve/host_routing.py): which learner ranks each actor host pushes its rows to.

The property test replays random add/remove sequences and checks, after every operation, the routing's invariants
against an independent bookkeeping of the hosts and their agents.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.serve.host_routing import HostRouting

HOSTS = [f"host{index}" for index in range(9)]
"""The host names the operations draw from (more than the largest K, so both regimes occur)."""

OPERATION = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(HOSTS), st.integers(min_value=1, max_value=512)),
    st.tuples(st.just("remove"), st.sampled_from(HOSTS), st.just(0)),
)


def _endpoints(world_size: int) -> list[str]:
    return [f"tcp://*:{6000 + rank}" for rank in range(world_size)]


def _expected_loads(routing: HostRouting, agents: dict[str, int]) -> list[float]:
    """Agents per rank recomputed from ranks_of, a host's agents split evenly over its ranks."""
    loads = [0.0] * routing.world_size
    for host, count in agents.items():
        ranks = routing.ranks_of(host)
        for rank in ranks:
            loads[rank] += count / len(ranks)
    return loads


def _check_invariants(routing: HostRouting, agents: dict[str, int], removed: set[str]) -> None:
    world_size = routing.world_size
    for host in removed:
        assert routing.ranks_of(host) == ()
        assert routing.endpoints_of(host) == []
    for host in agents:
        ranks = routing.ranks_of(host)
        assert ranks, f"{host} is not routed"
        assert all(0 <= rank < world_size for rank in ranks)
        assert len(set(ranks)) == len(ranks)
        assert routing.endpoints_of(host) == [f"tcp://*:{6000 + rank}" for rank in ranks]
    assert routing.loads() == pytest.approx(_expected_loads(routing, agents), abs=1e-9)
    hosts = len(agents)
    if hosts == 0:
        return
    if hosts >= world_size:
        for host in agents:
            assert len(routing.ranks_of(host)) == 1
        loads = [0] * world_size
        for host, count in agents.items():
            loads[routing.ranks_of(host)[0]] += count
        low = min(loads)
        for host, count in agents.items():  # no host anywhere could narrow its rank's gap to the least loaded
            assert count >= loads[routing.ranks_of(host)[0]] - low, (loads, host, count)
        assert all(load > 0 for load in loads), loads  # so no rank is left without a host
    else:
        used = set()
        for host in agents:
            ranks = routing.ranks_of(host)
            index = ranks[0]
            assert index < hosts
            assert ranks == tuple(rank for rank in range(world_size) if rank % hosts == index)
            used.add(index)
        assert used == set(range(hosts))
        assert {rank for host in agents for rank in routing.ranks_of(host)} == set(range(world_size))


@settings(max_examples=200, deadline=None)
@given(world_size=st.integers(min_value=1, max_value=6), operations=st.lists(OPERATION, max_size=30))
def test_routing_invariants_hold_after_every_operation(world_size: int,
                                                       operations: list[tuple[str, str, int]]) -> None:
    routing = HostRouting(_endpoints(world_size))
    agents: dict[str, int] = {}
    removed: set[str] = set()
    for kind, host, count in operations:
        if kind == "add":
            assert routing.add(host, count) == routing.ranks_of(host)
            agents[host] = count
            removed.discard(host)
        else:
            routing.remove(host)
            if agents.pop(host, None) is not None:
                removed.add(host)
        _check_invariants(routing, agents, removed)


def test_no_rank_is_left_without_hosts_when_there_are_at_least_k() -> None:
    routing = HostRouting(_endpoints(3))
    for host, count in (("h0", 2), ("h1", 2), ("h2", 1), ("h3", 1)):
        routing.add(host, count)
    assert [routing.ranks_of(host) for host in ("h0", "h1", "h2", "h3")] == [(0,), (1,), (2,), (2,)]
    routing.remove("h0")
    # Before the fix loads were [0, 2, 2]: rank 0 got no rows although rank 2 had two hosts; one moves there now.
    assert all(load > 0 for load in routing.loads()), routing.loads()


def test_no_endpoints_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one rank endpoint"):
        HostRouting([])


def test_unknown_host_is_not_routed_and_removing_it_changes_nothing() -> None:
    routing = HostRouting(_endpoints(2))
    routing.add("a", 4)
    before = routing.ranks_of("a")
    routing.remove("nobody")
    assert routing.ranks_of("nobody") == ()
    assert routing.ranks_of("a") == before
    assert routing.moves == 0


def _routing_with_two_hosts_on_rank_one() -> HostRouting:
    """K=2: a (8 agents) on rank 0; b and c (4 each) on rank 1."""
    routing = HostRouting(_endpoints(2))
    routing.add("a", 8)
    assert routing.ranks_of("a") == (0, 1)
    routing.add("b", 4)
    assert (routing.ranks_of("a"), routing.ranks_of("b")) == ((0,), (1,))
    routing.add("c", 3)
    assert routing.ranks_of("c") == (1,)
    assert routing.loads() == [8.0, 7.0]
    assert routing.moves == 0
    return routing


def test_relieve_moves_the_donors_smallest_host_while_it_keeps_another() -> None:
    routing = _routing_with_two_hosts_on_rank_one()
    assert routing.relieve(0, 1) is True
    assert routing.ranks_of("c") == (0,)
    assert routing.ranks_of("b") == (1,)
    assert routing.moves == 1
    assert routing.loads() == [11.0, 4.0]
    assert routing.relieve(0, 1) is False, "rank 1 has only one host left"
    assert routing.ranks_of("b") == (1,)
    assert routing.moves == 1


def test_relieve_refuses_a_rank_relieving_itself() -> None:
    routing = _routing_with_two_hosts_on_rank_one()
    assert routing.relieve(1, 1) is False
    assert routing.moves == 0
    assert routing.ranks_of("c") == (1,)


def test_relieve_ignores_hosts_shared_among_ranks() -> None:
    routing = HostRouting(_endpoints(3))
    routing.add("a", 4)
    routing.add("b", 4)
    assert (routing.ranks_of("a"), routing.ranks_of("b")) == ((0, 2), (1,))
    assert routing.moves == 1, "a's ranks changed when b joined"
    assert routing.relieve(1, 0) is False
    assert routing.relieve(0, 2) is False
    assert routing.moves == 1
    assert (routing.ranks_of("a"), routing.ranks_of("b")) == ((0, 2), (1,))


def test_a_leaving_host_makes_the_others_rebalance_and_counts_the_move() -> None:
    routing = HostRouting(_endpoints(2))
    routing.add("a", 10)
    routing.add("b", 1)
    routing.add("c", 1)
    routing.add("d", 5)
    assert [routing.ranks_of(host) for host in "abcd"] == [(0,), (1,), (1,), (1,)]
    assert routing.loads() == [10.0, 7.0]
    assert routing.moves == 0
    routing.remove("a")
    # Gap 7 between rank 1 (7) and rank 0 (0): d (5 agents, nearest half the gap) moves; then gap 3 < 5 stops.
    assert routing.ranks_of("d") == (0,)
    assert routing.loads() == [5.0, 2.0]
    assert routing.moves == 1


def test_fewer_hosts_than_ranks_are_shared_and_a_reshuffle_counts_moves() -> None:
    routing = HostRouting(_endpoints(4))
    routing.add("a", 2)
    assert routing.ranks_of("a") == (0, 1, 2, 3)
    assert routing.moves == 0
    routing.add("b", 2)
    assert (routing.ranks_of("a"), routing.ranks_of("b")) == ((0, 2), (1, 3))
    assert routing.moves == 1, "a's ranks changed"
    assert routing.loads() == [1.0, 1.0, 1.0, 1.0]
    routing.remove("a")
    assert routing.ranks_of("b") == (0, 1, 2, 3)
    assert routing.moves == 2
