"""A real learner and actor host on MiniGrid DoorKey (configs/minigrid_doorkey.yaml): the Dict observation travels
as flat uint8 rows, the per-leaf encoder (with obs_norm) trains on them, and the run stops cleanly."""

from __future__ import annotations

import numpy as np
import pytest

from tests.processes import Run, metrics

pytestmark = pytest.mark.integration


def test_minigrid_doorkey_runs_updates_end_to_end(tmp_path) -> None:
    run = Run(tmp_path, "--set", "trainer.total_timesteps=16384", config="configs/minigrid_doorkey.yaml")
    try:
        run.train_to_the_end(1, learner_timeout=300)
    finally:
        run.close()
    records = metrics(run.run_dir)
    assert len(records) >= 2 and records[-1]["agent_steps"] >= 16384
    assert np.isfinite([r["policy_loss"] for r in records]).all()
