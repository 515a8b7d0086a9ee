"""Throughput, latency and cost benchmarks of Sluice, and its comparisons with peer systems (index: README.md here).

Each script runs from the repository root as ``.venv/bin/python -m ops.bench.<name> [--help]``; ``bash
ops/bench/run_all.sh`` runs the ones behind docs/RESULTS.md's Benchmarks table. The learning results (does a config
learn, how strong does it get) are in ops/experiments.
"""
