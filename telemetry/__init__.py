"""Prometheus for every Sluice process: a registry per process (``registry``), the HTTP endpoint that serves
``/metrics`` and any JSON routes beside it (``exporter``), and a histogram fed whole arrays at a time
(``bulk_histogram``). Which metrics each process exports lives with the process (learner/monitor/prometheus_metrics.py,
learner/pool/metrics.py, actors/host_metrics.py)."""
