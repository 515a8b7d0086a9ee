"""The run on disk: checkpoints and their integrity, the run directory and record, atomic writes, disk errors, JSONL tails."""
