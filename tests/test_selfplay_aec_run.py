"""Self-play end to end on a PettingZoo AEC game with real processes: learner (serving the pool, evaluating snapshots
during training with the kept-best gate) + actor host on tic-tac-toe (env.name pettingzoo_aec) with the random and
minimax baselines mixed in by name and by entry point, then the ELO tool and evaluate --opponent on the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.processes import REPO, Run, metrics

pytestmark = pytest.mark.integration

MINIMAX = "examples.tictactoe_players:MinimaxPlayer"
SMALL = ["--set", "trainer.batch_size=1024", "--set", "trainer.minibatch_size=512",
         "--set", "trainer.forward_pass_minibatch_target_size=32", "--set", "trainer.total_timesteps=12000",
         "--set", "selfplay.snapshot_interval=2", "--set", "selfplay.alternation_steps=20",
         "--set", "model.hidden_size=32", "--set", "evaluation.interval_updates=4", "--set", "evaluation.games=10",
         "--set", "evaluation.gate_games=10"]


@pytest.mark.slow
def test_tictactoe_selfplay_run_trains_evaluates_and_is_rated(tmp_path):
    run = Run(tmp_path, *SMALL, config="configs/tictactoe.yaml")
    try:
        run.train_to_the_end(2)
    finally:
        run.close()
    records = metrics(run.run_dir)
    last = records[-1]
    assert last["agent_steps"] >= 12000 and last["pool_snapshots"] >= 2
    assert abs(last["win_rate"] + last["draw_rate"] + last["loss_rate"] - 1) < 1e-9
    assert 5 <= last["episode_moves_mean"] <= 9  # tic-tac-toe games take 5 to 9 moves
    evaluations = [json.loads(line) for line in (run.run_dir / "evaluation.jsonl").read_text().splitlines()]
    assert evaluations and set(evaluations[0]["baselines"]) == {"random", MINIMAX}
    assert (run.run_dir / "best" / "best.json").is_file()
    done = subprocess.run([sys.executable, "-m", "evaluation.elo", "--run-dir", str(run.run_dir), "--episodes", "20",
                           "--max-snapshots", "2", "--bootstrap", "0", "--baselines", f"random,{MINIMAX}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    elo = json.loads((run.run_dir / "elo" / "elo.json").read_text())
    assert elo["baselines"] == ["random", MINIMAX] and elo["ratings"]["random"] == pytest.approx(1000.0)
    assert elo["ratings"][MINIMAX] > 1000  # perfect play is rated above random
    done = subprocess.run([sys.executable, "-m", "evaluation.evaluate", "--run-dir", str(run.run_dir), "--episodes",
                           "20", "--opponent", MINIMAX], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"against {MINIMAX}: win 0.000" in done.stdout  # nobody beats the perfect player
