"""The self-play opponent pool: the snapshot store, its server and its metrics."""
