"""PPO as specified: V-trace-clipped GAE, prioritized rows, clipped losses, schedules, the KL reference, and its stability options."""
