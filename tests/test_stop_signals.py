"""The actor host's stop signals: the first asks for a clean stop, a second one ends a host stuck in C code.

The process is real and so is what it is stuck in: a blocking ZeroMQ send on a PUSH socket with no peer, the call
that once kept a host deaf to SIGTERM (pyzmq retries it after each signal's handler returns)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.stop_flag import StopFlag, StopNow

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]

STUCK_HOST = """
import sys, zmq
from actors.stop_flag import StopFlag, StopNow, install_stop_signals
stop = StopFlag()
install_stop_signals(stop)
push = zmq.Context().socket(zmq.PUSH)
push.setsockopt(zmq.IMMEDIATE, 1)
push.connect("tcp://127.0.0.1:9")  # nothing listens: the blocking send waits for a peer forever
print("sending", flush=True)
try:
    push.send(b"rows")
except StopNow as err:
    print(f"stop requested: {stop.is_set()} ({stop.reason}); {err}", flush=True)
    push.close(linger=0)
    sys.exit(128 + err.signum)
print("sent?!", flush=True)
"""


@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)])
def test_a_second_signal_ends_a_host_blocked_in_a_send_the_first_could_not(first: int, second: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUCK_HOST], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline().strip() == "sending"
        time.sleep(0.3)
        proc.send_signal(first)
        with pytest.raises(subprocess.TimeoutExpired):  # the first only asks: the send goes on waiting
            proc.wait(timeout=1.0)
        proc.send_signal(second)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    name = signal.Signals(second).name
    assert proc.returncode == 128 + second, out
    assert out.strip() == (f"stop requested: True ({signal.Signals(first).name} received); {name} received again "
                           f"while stopping: stopping at once"), out


def test_stop_now_is_no_exception_a_broad_handler_swallows() -> None:
    assert not issubclass(StopNow, Exception) and issubclass(StopNow, BaseException)
    assert StopFlag().signals == 0



def test_the_cli_reports_a_second_signal_in_one_line_and_exits_128_plus_its_number(monkeypatch, capsys) -> None:
    """``python -m actors``' main when ``run_host`` is ended by a second signal (the stuck host above): one line,
    exit 128 + the signal's number."""
    from actors import cli, wiring

    def stuck(_options, stop):
        stop.request("SIGTERM received", signum=signal.SIGTERM)
        raise StopNow(signal.SIGINT)

    monkeypatch.setattr(wiring, "run_host", stuck)
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert cli.main(["--n", "1", "--learner", "tcp://127.0.0.1:9", "--null-policy"]) == 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "actors: stopped (SIGINT received again while stopping: stopping at once)")
