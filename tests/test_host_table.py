"""The registered actor hosts without a socket (learner/serve/host_table.py), driven with a fake clock: registration,
repeats of one session, heartbeats with stale tokens, silence, the learner's own pauses, BYE, counts and targets."""

from __future__ import annotations

import itertools
import threading

from learner.serve.host_table import OWN_PAUSE_S, Heartbeat, HostCounts, HostTable, Joined, Registration

A, B, C = b"host-a", b"host-b", b"host-c"


def table(peer_timeout_s: float = 10.0, max_hosts: int = 8) -> HostTable:
    """A table whose tokens count up (t1, t2, ...), so a test can tell them apart."""
    numbers = itertools.count(1)
    return HostTable(peer_timeout_s=peer_timeout_s, max_hosts=max_hosts, tokens=lambda: f"t{next(numbers)}")


def register(hosts: HostTable, identity: bytes, *, now: float = 0.0, session: str | None = "s1", name: str = "h",
             num_workers: int = 2, curve_key: str | None = None, metrics_address: str | None = None) -> Registration:
    return hosts.register(identity, name=name, num_workers=num_workers, now=now, session=session,
                          curve_key=curve_key, metrics_address=metrics_address)


def test_a_registration_holds_the_host_under_its_identity_with_a_new_token() -> None:
    hosts = table()
    first = register(hosts, A, name="gpu-1", num_workers=3, curve_key="key")
    assert first.joined is Joined.NEW and first.replaced is None and first.registered == 1
    assert first.host is not None and first.host.token == "t1" and first.host.identity == A
    assert (first.host.name, first.host.num_workers, first.host.curve_key) == ("gpu-1", 3, "key")
    assert hosts.get(A) == first.host and hosts.get(B) is None and len(hosts) == 1
    assert register(hosts, B).host.token == "t2" and len(hosts) == 2
    assert hosts.counts() == HostCounts(actor_hosts=2, lost=0, failed=0, registrations=2)


def test_a_repeat_of_the_same_session_is_the_registration_held_and_changes_nothing() -> None:
    hosts = table()
    held = register(hosts, A, session="s1", curve_key="key").host
    assert hosts.repeat_of(A, session="s1", curve_key="key", num_workers=2) == held
    assert hosts.repeat_of(A, session="s1", curve_key="key", num_workers=2).token == "t1"
    assert hosts.repeat_of(B, session="s1", curve_key="key", num_workers=2) is None  # another identity
    assert hosts.repeat_of(A, session="s2", curve_key="key", num_workers=2) is None  # another session
    assert hosts.repeat_of(A, session="s1", curve_key="other", num_workers=2) is None  # another key
    assert hosts.repeat_of(A, session="s1", curve_key="key", num_workers=4) is None  # another size
    assert hosts.counts().registrations == 1


def test_a_registration_without_a_session_is_never_a_repeat() -> None:
    hosts = table()
    register(hosts, A, session=None)
    assert hosts.repeat_of(A, session=None, curve_key=None, num_workers=2) is None


def test_a_new_session_gets_a_new_token_and_the_old_one_is_handed_back_to_drop() -> None:
    hosts = table()
    old = register(hosts, A, session="s1").host
    again = register(hosts, A, session="s2")
    assert again.joined is Joined.AGAIN and again.replaced == old and again.registered == 1
    assert again.host.token == "t2" != old.token and hosts.get(A).token == "t2"
    assert hosts.counts() == HostCounts(actor_hosts=1, lost=0, failed=0, registrations=2)


def test_a_heartbeat_is_judged_by_the_token_of_the_registration_held() -> None:
    hosts = table()
    assert hosts.heartbeat(A, "t1") is Heartbeat.NOT_REGISTERED
    register(hosts, A, session="s1")
    assert hosts.heartbeat(A, "t1") is Heartbeat.ACK and hosts.heartbeat(A) is Heartbeat.ACK  # no token: ack
    register(hosts, A, session="s2")
    assert hosts.heartbeat(A, "t1") is Heartbeat.STALE_TOKEN and hosts.heartbeat(A, "t2") is Heartbeat.ACK
    assert hosts.heartbeat(B) is Heartbeat.NOT_REGISTERED


def test_beyond_max_hosts_a_new_identity_is_refused_but_a_registered_one_may_register_again() -> None:
    hosts = table(max_hosts=2)
    register(hosts, A)
    register(hosts, B)
    full = register(hosts, C)
    assert full.joined is Joined.FULL and full.host is None and full.registered == 2
    assert hosts.get(C) is None and hosts.counts().registrations == 2
    assert register(hosts, A, session="s2").joined is Joined.AGAIN
    hosts.leave(B, failed=False)
    assert register(hosts, C).joined is Joined.NEW and len(hosts) == 2


def test_a_host_silent_past_peer_timeout_s_is_forgotten_and_counted_lost() -> None:
    hosts = table(peer_timeout_s=10.0)
    register(hosts, A, now=100.0)
    register(hosts, B, now=100.0)
    assert hosts.seen(B, 105.0) is not None and hosts.seen(C, 105.0) is None  # C was never registered
    assert hosts.expire(110.0) == ()  # exactly peer_timeout_s of silence: not yet
    gone = hosts.expire(110.5)
    assert [host.identity for host in gone] == [A] and hosts.get(A) is None
    assert hosts.silences(110.5) == {"h": 5.5}
    assert [host.identity for host in hosts.expire(115.5)] == [B]
    assert hosts.counts() == HostCounts(actor_hosts=0, lost=2, failed=0, registrations=2)
    assert hosts.heartbeat(A) is Heartbeat.NOT_REGISTERED


def test_the_learners_own_pause_is_added_to_every_hosts_allowance() -> None:
    hosts = table(peer_timeout_s=5.0)
    register(hosts, A, now=100.0)
    assert not hosts.excuse_pause(OWN_PAUSE_S - 0.1)  # a slow turn, not a pause: nothing excused
    assert hosts.excuse_pause(30.0)  # the loop turned 30 s after its last turn: this process was frozen
    assert hosts.expire(130.0) == () and len(hosts) == 1
    assert hosts.silences(130.0) == {"h": 0.0}
    assert [host.identity for host in hosts.expire(135.5)] == [A]  # silent afterwards: lost after all
    assert hosts.counts().lost == 1


def test_bye_removes_the_host_and_counts_it_failed_only_when_it_names_a_failure() -> None:
    hosts = table()
    register(hosts, A)
    register(hosts, B)
    assert hosts.leave(A, failed=False).identity == A and hosts.get(A) is None
    assert hosts.leave(B, failed=True).identity == B
    assert hosts.leave(B, failed=True) is None  # no longer registered: nothing more to count
    assert hosts.counts() == HostCounts(actor_hosts=0, lost=0, failed=1, registrations=2)
    assert hosts.expire(1e9) == () and hosts.counts().lost == 0


def test_dropping_curve_keys_forgets_their_hosts_without_counting_them_lost() -> None:
    hosts = table()
    register(hosts, A, curve_key="k1")
    register(hosts, B, curve_key="k2")
    register(hosts, C)
    assert hosts.drop_keys(set()) == ()
    assert [host.identity for host in hosts.drop_keys({"k1", "k9"})] == [A]
    assert hosts.get(A) is None and len(hosts) == 2 and hosts.counts().lost == 0


def test_metrics_targets_list_the_hosts_with_an_address_sorted_by_name() -> None:
    hosts = table()
    register(hosts, A, name="zeta", metrics_address="10.0.0.2:9100")
    register(hosts, B, name="alpha", metrics_address="10.0.0.1:9100")
    register(hosts, C, name="none")
    assert hosts.metrics_targets() == [{"targets": ["10.0.0.1:9100"], "labels": {"host": "alpha"}},
                                       {"targets": ["10.0.0.2:9100"], "labels": {"host": "zeta"}}]
    hosts.leave(A, failed=False)
    assert hosts.metrics_targets() == [{"targets": ["10.0.0.1:9100"], "labels": {"host": "alpha"}}]


def test_the_default_tokens_are_fresh_and_unguessable() -> None:
    hosts = HostTable(peer_timeout_s=1.0)
    first = hosts.register(A, name="h", num_workers=1, now=0.0).host.token
    second = hosts.register(A, name="h", num_workers=1, now=0.0).host.token
    assert first != second and len(first) == 32


def test_reads_from_another_thread_see_counts_only_grow_while_hosts_come_and_go() -> None:
    hosts = table(max_hosts=1000)
    stop = threading.Event()
    seen: list[HostCounts] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(hosts.counts())
            hosts.metrics_targets()
            hosts.silences(0.0)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for index in range(2000):
            identity = f"h{index % 50}".encode()
            register(hosts, identity, session=str(index))
            hosts.seen(identity, float(index))
            if index % 3 == 0:
                hosts.leave(identity, failed=True)
            hosts.expire(float(index) - 10)
    finally:
        stop.set()
        reader.join()
    assert seen and all(count.actor_hosts <= 50 for count in seen)
    for before, after in itertools.pairwise(seen):
        assert after.registrations >= before.registrations and after.lost >= before.lost
        assert after.failed >= before.failed
    final = hosts.counts()
    assert final.registrations == 2000 and final.failed == 667 and final.actor_hosts <= 50
