"""Real learner and actor host processes: the ingest's checks never refuse a message a real host sends, under
back-pressure (a learner slower than its hosts, few rows per message, so the hosts' row buffers fill and the
steps counted between two messages approach learner.serve.row_checks.max_agent_steps), with masks, turn-based
inactive seats and self-play (connect four), and with float observations (cartpole)."""

from __future__ import annotations

import pytest

from tests.processes import Run, metrics

pytestmark = pytest.mark.integration

SLOW_LEARNER_SMALL_BLOCKS = ["--set", "network.rows_per_message=2", "--set", "network.message_bytes=0",
                             "--set", "trainer.update_epochs=8",
                             "--set", "trainer.target_episode_return=null"]
CASES = {
    "cartpole": ("configs/cartpole.yaml", ["--set", "trainer.total_timesteps=40000"]),
    "connect_four_selfplay": ("configs/selfplay_connect4.yaml", [
        "--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024",
        "--set", "trainer.forward_pass_minibatch_target_size=32", "--set", "trainer.total_timesteps=16000",
        "--set", "trainer.bptt_horizon=8", "--set", "selfplay.snapshot_interval=2",
        "--set", "selfplay.alternation_steps=40", "--set", "model.hidden_size=32"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_actor_hosts_never_have_a_rows_message_refused(tmp_path, case):
    config, overrides = CASES[case]
    run = Run(tmp_path, *overrides, *SLOW_LEARNER_SMALL_BLOCKS, config=config)
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
        run.assert_clean()
    finally:
        run.close()
