"""The learning experiments behind the README's and docs/RESULTS.md's learning tables (index: README.md here).

Each script runs from the repository root as ``.venv/bin/python -m ops.experiments.<name> [--help]``: it trains
through the real learner and actor processes (``pipeline_run.trained_run``) and scores what was learned. The
throughput and peer benchmarks are in ops/bench.
"""
