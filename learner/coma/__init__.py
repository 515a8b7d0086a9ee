"""COMA for cooperative continuous control: per-agent actors, a centralised critic and targets, team rows to transitions, a replay buffer, and a serial mode."""
