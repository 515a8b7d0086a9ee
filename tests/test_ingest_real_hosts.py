"""Real learner and actor host processes: the ingest's checks never refuse a message a real host sends, under
back-pressure (a learner slower than its hosts, so the hosts' row buffers fill; with few rows per message the
steps counted between two messages approach learner.serve.row_checks.max_agent_steps), with masks, turn-based
inactive seats and self-play (connect four, 2 rows per message), and with float observations in messages of a
whole batch (cartpole)."""

from __future__ import annotations

import pytest

from tests.processes import Run, metrics

pytestmark = pytest.mark.integration

SLOW_LEARNER = ["--set", "trainer.update_epochs=8", "--set", "trainer.target_episode_return=null"]
SMALL_BLOCKS = ["--set", "network.rows_per_message=2", "--set", "network.message_bytes=0"]
CASES = {
    # a longer queue: 637-byte rows travel a whole batch (512 rows) to a message (envs.rows.message_sizing)
    "cartpole_big_messages": ("configs/cartpole.yaml", ["--set", "trainer.total_timesteps=40000",
                                                        "--set", "network.send_queue_messages=32"]),
    "connect_four_selfplay": ("configs/selfplay_connect4.yaml", [
        "--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024",
        "--set", "trainer.forward_pass_minibatch_target_size=32", "--set", "trainer.total_timesteps=16000",
        "--set", "trainer.bptt_horizon=8", "--set", "selfplay.snapshot_interval=2",
        "--set", "selfplay.alternation_steps=40", "--set", "model.hidden_size=32", *SMALL_BLOCKS]),
}
ROWS_PER_MESSAGE = {"cartpole_big_messages": 512, "connect_four_selfplay": 2}


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_actor_hosts_never_have_a_rows_message_refused(tmp_path, case):
    config, overrides = CASES[case]
    run = Run(tmp_path, *overrides, *SLOW_LEARNER, config=config)
    try:
        learner = run.learner()
        actors = run.actors(2)
        run.note_workers(actors)
        assert learner.wait(timeout=240) == 0, run.log("learner.log")
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
        records = metrics(run.run_dir)
        assert records and records[-1]["agent_steps"] > 0
        assert [r["messages_dropped"] for r in records] == [0] * len(records), run.log("learner.log")
        assert "refused a ROWS message" not in run.log("learner.log")
        assert f", up to {ROWS_PER_MESSAGE[case]} rows per message," in run.log("actors.log")
        run.assert_clean()
    finally:
        run.close()
