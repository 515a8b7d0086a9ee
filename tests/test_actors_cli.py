"""The actor host's command-line errors, and shared-memory hygiene."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from actors.cli import main
from actors.shm import ShmSegment, plan_layout, remove_stale_segments, segment_name, SHM_DIR
from tests.processes import REPO


@pytest.mark.parametrize("argv, message", [
    (["--n", "0"], "--n must be at least 1, got 0"),
    (["--learner", "localhost:5555"], "--learner 'localhost:5555' is not a ZeroMQ endpoint"),
    (["--learner", "tcp://*:5555"], "needs the learner's host name or address"),
    (["--learner", "tcp://127.0.0.1:99999"], "--learner"),
    (["--hosts", "0"], "--hosts must be at least 1, got 0"),
    (["--hosts", "2"], "--hosts 2 needs --n: the env workers to split among the host processes"),
    (["--hosts", "3", "--n", "2"], "--hosts 3 needs at least 3 env workers (one per host process), got --n 2"),
    (["--worker-nice", "-1"], "--worker-nice must be 0 to 19 (added to the workers' niceness; a negative one would "
                              "need root and take the CPU from the host), got -1"),
    (["--worker-nice", "20"], "--worker-nice must be 0 to 19"),
    (["--worker-threads", "0"], "--worker-threads must be 1 or more (numeric-library threads in each env worker), "
                                "got 0"),
])
def test_cli_errors_name_the_problem(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m actors: error: ")
    assert message in err


@pytest.mark.integration
def test_cli_error_from_a_real_process():
    result = subprocess.run([sys.executable, "-m", "actors", "--n", "-3"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "--n must be at least 1, got -3" in result.stderr


@pytest.mark.integration
def test_segments_of_dead_owners_are_removed_and_live_ones_kept():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = ShmSegment.create(segment_name(int(dead), "w0"), 4096)
    live = ShmSegment.create(segment_name(1, "w0"), 4096)  # PID 1 is always alive
    try:
        removed = remove_stale_segments()
        assert stale.name in removed
        assert not (SHM_DIR / stale.name).exists()
        assert (SHM_DIR / live.name).exists()
    finally:
        stale.close()
        live.close()
    assert not (SHM_DIR / live.name).exists()


def test_views_share_memory_between_mappings():
    layout, size = plan_layout([("a", (3, 4), "float32"), ("b", (5,), "uint8")])
    assert all(f.offset % 64 == 0 for f in layout)
    owner = ShmSegment.create(segment_name(1, "viewtest"), size)
    other = ShmSegment.attach(owner.name, size)
    try:
        mine, theirs = owner.views(layout), other.views(layout)
        mine["a"][:] = np.arange(12, dtype=np.float32).reshape(3, 4)
        mine["b"][:] = 7
        np.testing.assert_array_equal(theirs["a"], mine["a"])
        assert theirs["b"].tolist() == [7] * 5
        del mine, theirs
    finally:
        other.close()
        owner.close()
    assert not (SHM_DIR / owner.name).exists()


def test_segment_names_must_carry_the_prefix():
    with pytest.raises(ValueError, match="must start with 'sluice_'"):
        ShmSegment.create("other_1_w0", 64)


@pytest.fixture
def in_process(monkeypatch):
    """Run ``main`` inside the test: pytest keeps its signal handlers, and torch and BLAS their thread counts."""
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr("actors.wiring.use_threads", lambda n: None)
    return monkeypatch


def _registered(config: dict):
    """LearnerLink.register as if a learner answered with ``config`` (no learner needed)."""
    from actors.learner_link import Registration

    registration = Registration(config=config, run_id="run", version=0, weights={}, data_port=1, weights_port=2)
    return lambda self, **kwargs: registration


@pytest.mark.parametrize("config, message", [
    ({"trainer": {"no_such_key": 1}}, "trainer.no_such_key"),
    pytest.param({"env": {"name": "native", "entry_point": "no_such_module:Env"}}, "no_such_module",
                 marks=pytest.mark.integration),  # the host reads an external env's spec in a child process
])
def test_a_config_error_exits_2_with_one_line(config, message, in_process, capsys):
    from actors.learner_link import LearnerLink

    in_process.setattr(LearnerLink, "register", _registered(config))
    assert main(["--learner", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m actors: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_internal_error_propagates_with_its_traceback(in_process):
    """A plain ValueError inside the host is a bug, not a usage error: it must not become exit 2."""
    from actors import wiring
    from actors.learner_link import LearnerLink

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    in_process.setattr(LearnerLink, "register", _registered({}))
    in_process.setattr(wiring, "make_plan", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["--learner", "tcp://127.0.0.1:1"])


@pytest.mark.integration
def test_version_prints_the_package_version():
    import importlib.metadata

    result = subprocess.run([sys.executable, "-m", "actors", "--version"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"python -m actors {importlib.metadata.version('sluice')}"


def test_waiting_notice_names_the_address_time_and_what_to_check():
    from actors.learner_link import waiting_notice
    from protocol.endpoints import parse_endpoint

    remote = waiting_notice(parse_endpoint("tcp://10.1.2.3:7000", "--learner"), waited_s=12.4, curve=True)
    assert remote.startswith("actors: waiting for the learner at tcp://10.1.2.3:7000 ...")
    assert "12 s so far" in remote and "is 7000 the network.port" in remote
    assert "ports 7000-7002" in remote and "--curve-server-key must be that learner's server.key" in remote
    local = waiting_notice(parse_endpoint("tcp://127.0.0.1:7000", "--learner"), waited_s=0, curve=False)
    assert "firewall" not in local and "needs --curve-server-key and --curve-client-key" in local


@pytest.mark.integration
def test_a_host_without_a_learner_keeps_saying_where_it_waits(tmp_path):
    from tests.processes import descendants, free_port_triple, kill_tree, shm_segments, start, wait_for

    port = free_port_triple()
    log = tmp_path / "actors.log"
    host = start("actors", "--n", "1", "--learner", f"tcp://127.0.0.1:{port}", log=log)
    try:
        def waiting_lines() -> list[str]:
            return [line for line in log.read_text().splitlines() if "waiting for the learner at" in line]

        assert wait_for(lambda: len(waiting_lines()) >= 2, 60), log.read_text()
        first, second = waiting_lines()[:2]  # the hints once, then a short line (the gaps double from 5 s)
        assert first.startswith(f"actors: waiting for the learner at tcp://127.0.0.1:{port} ...")
        assert " s so far" in first and "is the learner started?" in first
        assert f"is {port} the network.port of the learner's config?" in first
        assert second.startswith(f"actors: still waiting for the learner at tcp://127.0.0.1:{port} (")
        assert second.endswith(" s so far)") and "?" not in second and len(second) < 100
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=30) == 143, log.read_text()  # 128 + SIGTERM, as the learner
        assert not descendants(host.pid) and shm_segments(host.pid) == []
    finally:
        kill_tree(host)


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_a_gpu_is_refused_in_one_line():
    result = subprocess.run([sys.executable, "-m", "actors", "--device", "cuda"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m actors: error: --device cuda but torch sees no CUDA device (torch.cuda.is_available() is False); "
        "leave --device out to run the policy on the CPU"]


def test_device_names_the_allowed_values(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "gpu"])
    assert exit_info.value.code == 2
    assert "argument --device: invalid choice: 'gpu' (choose from 'cpu', 'cuda')" in capsys.readouterr().err


def test_worker_scheduler_names_the_allowed_values(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--worker-scheduler", "fifo"])
    assert exit_info.value.code == 2
    assert "argument --worker-scheduler: invalid choice: 'fifo' (choose from 'batch', 'normal')" in capsys.readouterr().err
