"""Real learner and actor processes over real ZeroMQ sockets and shared memory."""

from __future__ import annotations

import signal
import time

import pytest
import zmq

from protocol import Message, MessageType, decode, encode
from tests.processes import Run, alive, ipc_files, metrics, shm_segments, start, wait_for

pytestmark = pytest.mark.integration

REQUIRED_METRICS = ("update", "env_steps", "agent_steps", "sps", "episode_return_mean", "episode_length_mean",
                    "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance",
                    "learning_rate", "policy_version", "policy_lag_mean")


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    yield r
    r.close()


@pytest.mark.slow
def test_cartpole_trains_to_475(run):
    learner = run.learner()
    actors = run.actors(2)
    run.note_workers(actors)
    assert learner.wait(timeout=300) == 0, run.log("learner.log")
    assert actors.wait(timeout=30) == 0, run.log("actors.log")
    out = run.log("learner.log")
    assert "solved: mean return" in out
    records = metrics(run.run_dir)
    assert records and all(key in records[-1] for key in REQUIRED_METRICS)
    assert records[-1]["episode_return_mean"] >= 475
    # what actor hosts report about their inference step and workers reaches the learner's metrics
    timed = [r for r in records if r["inference_batch_agents_mean"] is not None]
    assert timed and all(0 < r["inference_batch_agents_mean"] <= 64 for r in timed)  # forward-pass target 64
    assert all(0 <= r["worker_wait_fraction"] <= 1 and r["inference_ms_per_batch"] > 0 for r in timed)
    assert [r["update"] for r in records] == list(range(1, len(records) + 1))
    assert list((run.run_dir / "checkpoints").glob("update_*/model.safetensors"))
    assert (run.run_dir / "config.yaml").exists()
    assert "stopped (learner: target return reached)" in run.log("actors.log")
    # configs/cartpole.yaml queues 2 messages of 32 rows (fresh rows learn faster): bigger messages would hold more
    assert ", up to 32 rows per message," in run.log("actors.log")
    assert [r["messages_dropped"] for r in records] == [0] * len(records)
    run.assert_clean()


@pytest.mark.slow
def test_two_actor_hosts_started_before_the_learner(run):
    first, second = run.actors(1, log="a1.log"), run.actors(1, log="a2.log")
    assert wait_for(lambda: "waiting for the learner" in run.log("a1.log"), 30)
    learner = run.learner("--set", "trainer.target_episode_return=null",
                          "--set", "trainer.total_timesteps=150000")
    assert learner.wait(timeout=180) == 0, run.log("learner.log")
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    assert run.log("learner.log").count("joined with 1 workers") == 2
    assert max(r["actor_hosts"] for r in metrics(run.run_dir)) == 2
    assert metrics(run.run_dir)[-1]["env_steps"] >= 150000
    run.assert_clean()


def test_sigterm_to_learner_stops_everything_cleanly(run):
    learner = run.learner("--set", "trainer.target_episode_return=null")
    actors = run.actors(2)
    run.note_workers(actors)
    assert wait_for(lambda: len(metrics(run.run_dir)) >= 3, 120)
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143  # 128 + SIGTERM: stopped, not finished
    assert actors.wait(timeout=30) == 0, run.log("actors.log")
    assert "stopped (learner: SIGTERM received)" in run.log("actors.log")
    assert (f"actors: rows go to the learner over ipc:///tmp/sluice_{learner.pid}_data0 (same machine)"
            in run.log("actors.log"))  # a learner on this machine: rows over its unix socket (its file: assert_clean)
    last = metrics(run.run_dir)[-1]["update"]
    assert (run.run_dir / "checkpoints" / f"update_{last:08d}").is_dir()
    assert not list((run.run_dir / "checkpoints").glob(".tmp-*"))
    run.assert_clean()


def test_ctrl_c_on_actor_host_reaps_workers_and_shared_memory(run):
    learner = run.learner("--set", "trainer.target_episode_return=null", "--set", "network.same_machine_ipc=false")
    actors = run.actors(2)
    workers = run.note_workers(actors)
    assert wait_for(lambda: len(metrics(run.run_dir)) >= 2, 120)
    assert "over ipc" not in run.log("actors.log") and ipc_files(learner.pid) == []  # rows over TCP, as asked
    assert shm_segments(actors.pid)
    actors.send_signal(signal.SIGINT)
    assert actors.wait(timeout=30) == 130, run.log("actors.log")  # 128 + SIGINT
    assert wait_for(lambda: all(not alive(pid) for pid in workers), 5)
    assert learner.poll() is None, "the learner must keep running when an actor host leaves"
    learner.send_signal(signal.SIGINT)
    assert learner.wait(timeout=30) == 130  # 128 + SIGINT
    run.assert_clean()


@pytest.mark.slow
def test_resume_continues_from_the_last_checkpoint(run):
    first = run.learner("--set", "trainer.target_episode_return=null", "--set", "trainer.total_timesteps=60000")
    actors = run.actors(2)
    assert first.wait(timeout=120) == 0, run.log("learner.log")
    assert actors.wait(timeout=30) == 0
    done = metrics(run.run_dir)[-1]
    resumed = start("learner", "--resume", "--run-dir", str(run.run_dir), "--set", f"network.port={run.port}",
                    "--set", "trainer.total_timesteps=120000", log=run.tmp / "resumed.log")
    run.procs.append(resumed)
    actors2 = run.actors(2, log="actors2.log")
    assert resumed.wait(timeout=120) == 0, run.log("resumed.log")
    assert actors2.wait(timeout=30) == 0
    later = [r for r in metrics(run.run_dir) if r["update"] > done["update"]]
    assert later and later[0]["update"] == done["update"] + 1
    assert later[0]["env_steps"] > done["env_steps"]
    assert later[-1]["policy_version"] == later[-1]["update"]
    run.assert_clean()


def test_seed_003_options_end_to_end(run):
    """KL to a refreshed reference, value warm-up, AdamW, gradient accumulation, zero value head: a real run."""
    learner = run.learner("--set", "trainer.target_episode_return=null", "--set", "trainer.total_timesteps=120000",
                          "--set", "trainer.kl_divergence_coef_rho=0.5", "--set", "trainer.coef_rho_decay=0.9",
                          "--set", "trainer.enable_ref_update=true", "--set", "trainer.ref_update_interval=4",
                          "--set", "trainer.vf_warmup=3", "--set", "trainer.optimizer=adamw",
                          "--set", "trainer.weight_decay=0.01", "--set", "trainer.gradient_accumulation=2",
                          "--set", "trainer.zero_initial_vf=true")
    actors = run.actors(2)
    assert learner.wait(timeout=120) == 0, run.log("learner.log")
    assert actors.wait(timeout=30) == 0
    records = metrics(run.run_dir)
    assert len(records) >= 8
    assert [r["vf_warmup"] for r in records[:4]] == [1.0, 1.0, 1.0, 0.0]
    for r in records:
        assert r["kl_coef"] == pytest.approx(0.5 * 0.9 ** (r["update"] - 1), rel=1e-9)
        assert r["gradient_steps"] + r["skipped_steps"] == 8  # 4 minibatches x 4 epochs / 2 accumulated
    assert records[0]["explained_variance"] == pytest.approx(0.0, abs=1e-6)  # values start at exactly 0
    assert all(r["kl_loss"] >= 0 for r in records) and any(r["kl_loss"] > 0 for r in records[3:])
    last = sorted((run.run_dir / "checkpoints").glob("update_*"))[-1]
    assert (last / "reference.safetensors").exists()
    run.assert_clean()


def test_malformed_messages_are_rejected_and_counted(run):
    learner = run.learner("--set", "trainer.target_episode_return=null")
    actors = run.actors(2)
    assert wait_for(lambda: len(metrics(run.run_dir)) >= 1, 120)
    context = zmq.Context()
    try:
        control = context.socket(zmq.DEALER)
        control.connect(f"tcp://127.0.0.1:{run.port}")
        control.send_multipart([b"sluice/9", b"junk"])
        assert control.poll(5000)
        reply = decode(control.recv_multipart())
        assert reply.type is MessageType.ERROR and reply.fields["reason"] == "bad_version"
        control.send_multipart(encode(Message(type=MessageType.HEARTBEAT, sender="stranger")))
        assert control.poll(5000)
        reply = decode(control.recv_multipart())
        assert reply.type is MessageType.ERROR and "before register" in reply.fields["message"]
        data = context.socket(zmq.PUSH)
        data.connect(f"tcp://127.0.0.1:{run.port + 1}")
        data.send_multipart([b"sluice/1", b"\xff\xfe not msgpack"])
        data.send_multipart(encode(Message(type=MessageType.ROWS, sender="x", fields={
            "num_rows": 1, "episode_returns": [], "episode_lengths": [], "env_steps": 0, "agent_steps": 0})))
        time.sleep(0.5)
        for sock in (control, data):
            sock.close(linger=0)
    finally:
        context.term()
    assert wait_for(lambda: metrics(run.run_dir)[-1]["messages_dropped"] >= 2, 60)
    assert learner.poll() is None
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143
    assert actors.wait(timeout=30) == 0
    run.assert_clean()
