"""The actor host's first hour (issue 32): train_local's host follows the learner's port, exit codes as the learner's,
BYE after the last row, heartbeats while the host is built (numba compiling), and messages that say the right thing
once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from actors.alternation import INFO_EVERY_S, OpponentAlternation
from actors.cli import main
from actors.learner_link import LearnerLink, Registration, notice_gaps, still_waiting_notice, waiting_notice
from actors.stop_flag import StopFlag
from protocol import Limits, MessageType, decode
from protocol.endpoints import parse_endpoint
from tests.processes import REPO, Run, free_port_triple, kill_tree, metrics, session_members, wait_for

TINY = ["--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024",
        "--set", "trainer.target_episode_return=null"]


# -- exit codes ---------------------------------------------------------------------------------------------------

def test_the_first_stop_request_decides_the_exit_code():
    by_signal = StopFlag()
    by_signal.request("SIGTERM received", signum=signal.SIGTERM)
    by_signal.request("learner: target return reached")
    assert by_signal.reason == "SIGTERM received" and by_signal.exit_code() == 143
    by_learner = StopFlag()
    by_learner.request("learner: target return reached")
    by_learner.request("SIGINT received", signum=signal.SIGINT)  # Ctrl-C while stopping: still the learner's stop
    assert by_learner.reason == "learner: target return reached" and by_learner.exit_code() == 0
    interrupted = StopFlag()
    interrupted.request("SIGINT received", signum=signal.SIGINT)
    assert interrupted.exit_code() == 130


# -- messages -----------------------------------------------------------------------------------------------------

@pytest.fixture
def in_process(monkeypatch):
    """Run ``main`` inside the test: pytest keeps its signal handlers, and torch and BLAS their thread counts."""
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr("actors.wiring.use_threads", lambda n: None)
    return monkeypatch


def test_a_refused_host_prints_its_error_and_no_stopped_done(in_process, capsys):
    from actors.learner_link import LearnerRefused

    def refuse(self, **kwargs):
        raise LearnerRefused("learner refused registration: too many hosts")

    in_process.setattr(LearnerLink, "register", refuse)
    assert main(["--learner", "tcp://127.0.0.1:1"]) == 2
    captured = capsys.readouterr()
    assert "stopped" not in captured.out
    assert captured.err == "python -m actors: error: learner refused registration: too many hosts\n"


def test_a_shutdown_answering_register_is_the_learner_ending_the_run(in_process, capsys):
    def shutdown(self, **kwargs):
        self.shutdown_reason = "target return reached"
        return None

    in_process.setattr(LearnerLink, "register", shutdown)
    assert main(["--learner", "tcp://127.0.0.1:1"]) == 0
    out = capsys.readouterr().out
    assert "actors: stopped (learner: target return reached)" in out and "done" not in out


def test_waiting_lines_give_the_hints_once_then_back_off():
    learner = parse_endpoint("tcp://127.0.0.1:7000", "--learner")
    gaps = notice_gaps()
    assert [next(gaps) for _ in range(7)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    short = still_waiting_notice(learner, waited_s=35.2)
    assert short == "actors: still waiting for the learner at tcp://127.0.0.1:7000 (35 s so far)"
    assert len(waiting_notice(learner, waited_s=0, curve=False)) > 200 and len(short) < 80


class _Cache:
    downloads = 3


class _Opponents:
    env_digests = [None] * 4
    cache = _Cache()

    def assign(self, assignment) -> None:
        pass


class _Client:
    def __init__(self) -> None:
        self.alternation = 0

    def opponents(self, num_envs: int):
        self.alternation += 1
        return SimpleNamespace(alternation=self.alternation, digests=("a",) * num_envs)


def test_alternations_are_logged_at_info_once_per_minute_and_summed_up(caplog):
    now = [0.0]
    with caplog.at_level(logging.DEBUG, logger="sluice.actors"):
        alternation = OpponentAlternation(client=_Client(), opponents=_Opponents(), steps_per_alternation=10,
                                          clock=lambda: now[0])
        for step in range(1, 16):  # an alternation every 4 s for a minute
            now[0] = 4.0 * step
            alternation.maybe_next(10 * step)
    lines = [(record.levelno, record.getMessage()) for record in caplog.records if "alternation" in record.getMessage()]
    assert len(lines) == 16
    info = [text for level, text in lines if level == logging.INFO]
    assert len(info) == 2 and info[0].startswith("alternation 1: ") and info[1].startswith("alternation 16: ")
    assert 4.0 * 15 >= INFO_EVERY_S
    assert alternation.summary() == "self-play: drew opponents 16 times (last: alternation 16), 3 snapshots downloaded"


# -- warm-up and heartbeats while the host is built --------------------------------------------------------------

def test_warm_up_compiles_every_kernel_the_host_calls():
    from actors import row_kernels
    from actors.assembler import RowAssembler
    from configs.loader import load_config
    from envs.registry import env_spec
    from envs.rows import row_layout

    kernels = [row_kernels.add_steps_kernel, row_kernels.pop_full_kernel, row_kernels.release_kernel,
               row_kernels.gather_kernel]  # those the host calls
    spec = env_spec(load_config(None).env)
    assembler = RowAssembler.for_layout(row_layout(spec, horizon=5, state_size=8), num_agents=6, num_rows=20)
    before = [rows.copy() for rows in (assembler.free_ring, assembler.rings)]
    assembler.warm_up()
    assert [rows.tolist() for rows in (assembler.free_ring, assembler.rings)] == [rows.tolist() for rows in before]
    compiled = [len(kernel.signatures) for kernel in kernels]
    assert all(compiled)
    ids = np.arange(3)
    values = {b.name: np.ones((3, *b.value_shape), b.dtype) for b in assembler._buffers
              if b.name != "versions" and b.width}
    for _ in range(6):  # as the stepper: steps that fill rows, then ship and release them
        assembler.add(ids, 1, **values)
    rows = assembler.pop_full(8)
    assembler.gather_packed(rows)
    assembler.release(rows)
    assert [len(kernel.signatures) for kernel in kernels] == compiled, "the host's first steps compiled a kernel"


def test_heartbeats_go_out_from_a_thread_while_the_host_is_busy():
    context = zmq.Context()
    learner = context.socket(zmq.ROUTER)
    port = learner.bind_to_random_port("tcp://127.0.0.1")
    link = LearnerLink(parse_endpoint(f"tcp://127.0.0.1:{port}", "--learner"), num_workers=1, limits=Limits())
    try:
        link.token = "secret"
        assert wait_for(lambda: link.send_control(MessageType.HEARTBEAT, {"token": "secret"}), 5)  # connected
        with link.heartbeats_meanwhile(0.05):
            busy_until = time.monotonic() + 0.6
            while time.monotonic() < busy_until:  # pure Python holding the GIL, as numba's compiler does
                sum(range(1000))
        beats = []
        while learner.poll(200):
            message = decode(learner.recv_multipart()[1:], Limits())
            if message.type is MessageType.HEARTBEAT:
                beats.append(message.fields["token"])
        assert len(beats) >= 5 and set(beats) == {"secret"}
    finally:
        link.close()
        learner.close(linger=0)
        context.term()


def test_bye_goes_out_after_the_data_socket_is_closed():
    context = zmq.Context()
    learner = context.socket(zmq.ROUTER)
    port = learner.bind_to_random_port("tcp://127.0.0.1")
    link = LearnerLink(parse_endpoint(f"tcp://127.0.0.1:{port}", "--learner"), num_workers=1, limits=Limits())
    link.open_streams(Registration(config={}, run_id="r", version=0, weights={}, data_port=port + 1,
                                   weights_port=port + 2), hwm=2, buffer_bytes=65536)
    sent = []
    real_send = link.send_control

    def recording(type_, fields=None):
        sent.append((type_, link.data is None))
        return real_send(type_, fields)

    link.send_control = recording
    link.close()
    learner.close(linger=0)
    context.term()
    assert sent == [(MessageType.BYE, True)], "no row may leave the host after its BYE"


# -- with real processes ------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_signals_exit_128_plus_signum_a_cold_jit_is_not_silence_and_leaving_is_no_refusal(tmp_path, monkeypatch):
    """A host compiling its kernels on a cold numba cache keeps heartbeating (peer timeout 3 s); SIGINT and SIGTERM
    stop hosts with 130 and 143; the learner logs them leaving, never refusing their rows as not_registered."""
    run = Run(tmp_path, *TINY, "--set", "network.peer_timeout_s=3")
    try:
        learner = run.learner()
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "empty-numba-cache"))
        cold = run.actors(1, log="cold.log")
        monkeypatch.delenv("NUMBA_CACHE_DIR")
        assert wait_for(lambda: len(metrics(run.run_dir)) >= 2, 180), run.log("learner.log") + run.log("cold.log")
        assert "forgotten" not in run.log("learner.log") and "registering again" not in run.log("cold.log")
        cold.send_signal(signal.SIGINT)
        assert cold.wait(timeout=30) == 130, run.log("cold.log")
        assert run.log("cold.log").rstrip().endswith("actors: stopped (SIGINT received)")

        warm = run.actors(1, log="warm.log")
        updates = len(metrics(run.run_dir))
        assert wait_for(lambda: len(metrics(run.run_dir)) >= updates + 2, 120), run.log("learner.log")
        warm.send_signal(signal.SIGTERM)
        assert warm.wait(timeout=30) == 143, run.log("warm.log")
        assert wait_for(lambda: run.log("learner.log").count(" left") >= 2, 10), run.log("learner.log")
        time.sleep(2)  # rows still on their way would be refused now
        out = run.log("learner.log")
        assert "refused a ROWS message" not in out, out
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=60) == 143, run.log("learner.log")
        run.assert_clean()
    finally:
        run.close()


@pytest.mark.integration
def test_train_local_starts_the_host_on_the_learners_port(tmp_path):
    port = free_port_triple()
    log = tmp_path / "train_local.log"
    env = {**os.environ, "SLUICE_SKIP_SETUP": "1", "SLUICE_WORKERS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "ops/train_local.sh", "--set", f"network.port={port}", *TINY,
                                 "--set", "trainer.total_timesteps=4000", "--run-dir", str(tmp_path / "run")],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            assert proc.wait(timeout=240) == 0, log.read_text()
        finally:
            kill_tree(proc)
    text = log.read_text()
    assert f"train_local: actor host dials the learner at tcp://127.0.0.1:{port}" in text
    assert f"learner tcp://127.0.0.1:{port} (as " in text and "joined with 1 workers" in text
    assert "train_local: learner exited 0" in text


@pytest.mark.integration
def test_train_local_stops_the_learner_when_its_host_fails_and_exits_with_the_hosts_code(tmp_path):
    """An env that cannot reset stops the actor host (exit 1); the learner, left without a host, would wait for one
    forever: train_local stops it, says why in one line and exits 1, leaving no process or shared memory."""
    port = free_port_triple()
    log = tmp_path / "train_local.log"
    env = {**os.environ, "SLUICE_SKIP_SETUP": "1", "SLUICE_WORKERS": "1", "PYTHONUNBUFFERED": "1"}
    before = set(Path("/dev/shm").glob("sluice_*"))
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "ops/train_local.sh", "--set", f"network.port={port}", "--set",
                                 "env.name=native", "--set", "env.entry_point=tests.faulty_envs:BrokenReset",
                                 "--run-dir", str(tmp_path / "run")],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            assert proc.wait(timeout=120) == 1, log.read_text()
            assert wait_for(lambda: not session_members(proc.pid), 10), "orphans of train_local"
        finally:
            kill_tree(proc)
    text = log.read_text()
    assert "python -m actors: error: env worker 0 could not start its env" in text
    assert "train_local: the actor host exited 1 (its reason is above); stopping the learner" in text
    assert "learner: stopped (SIGTERM received)" in text and "train_local: learner exited 143" in text
    assert set(Path("/dev/shm").glob("sluice_*")) <= before


@pytest.mark.integration
def test_train_local_with_arguments_the_learner_refuses_starts_no_host(tmp_path):
    log = tmp_path / "train_local.log"
    env = {**os.environ, "SLUICE_SKIP_SETUP": "1", "SLUICE_WORKERS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "ops/train_local.sh", "--set", "trainer.no_such_key=1"], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            assert proc.wait(timeout=120) == 2, log.read_text()
        finally:
            kill_tree(proc)
    text = log.read_text()
    assert "python -m learner: error: " in text and "trainer.no_such_key" in text
    assert "python -m actors" not in text and "actors:" not in text, "no host without a learner address"
