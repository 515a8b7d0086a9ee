"""What the learner says after each update, in one place: the metrics.jsonl record (and its scalars in TensorBoard,
W&B and MLflow), the console's progress line, the Prometheus figures, the value-head and input-saturation warnings,
and the evaluations the evaluator child finished since the previous update."""

from __future__ import annotations

import logging
from typing import Any

from learner.monitor.evaluation_results import ResultsTail, evaluation_line, evaluation_metrics
from learner.monitor.evaluator_process import EvaluatorProcess
from learner.monitor.health import ValueHealthMonitor
from learner.monitor.metrics_log import MetricsLog
from learner.monitor.metrics_record import Lap, metrics_record
from learner.monitor.progress import ProgressLine
from learner.monitor.tracking import Tracking
from learner.monitor.prometheus_metrics import LearnerMetrics
from learner.run.checkpoint import TrainerState
from learner.serve.control import ControlCounts
from learner.serve.ingest_counters import IngestSnapshot
from learner.update.input_health import SaturationMonitor

LOG = logging.getLogger("sluice.learner")


class UpdateReport:
    """Reports every update of one run."""

    def __init__(self, *, metrics: MetricsLog, progress: ProgressLine, prometheus: LearnerMetrics,
                 evaluator: EvaluatorProcess | None, evaluations: ResultsTail, samples_per_update: int,
                 tracking: Tracking | None = None) -> None:
        """``evaluator``: the child evaluating pool snapshots (None without evaluation during training), whose
        results ``evaluations`` reads; ``samples_per_update``: agent steps one update trains on (all ranks);
        ``tracking``: W&B / MLflow (learner/monitor/tracking.py; None: off)."""
        self.metrics = metrics
        self.tracking = tracking if tracking is not None else Tracking([])
        self.progress = progress
        self.prometheus = prometheus
        self.evaluator = evaluator
        self.evaluations = evaluations
        self.samples_per_update = samples_per_update
        self.value_health = ValueHealthMonitor()
        """Warns once when the value head stops explaining returns that vary (learner/monitor/health.py)."""
        self.saturation = SaturationMonitor()
        """Warns once when the first layer's units saturate (learner/update/input_health.py)."""

    def write(self, *, state: TrainerState, counted: IngestSnapshot, update_metrics: dict[str, float], lap: Lap,
              hosts: ControlCounts, update_s: float, selfplay: dict[str, Any], clients_refused: int,
              stopping: bool) -> None:
        """One record and console line for the update ``state`` has just counted; ``stopping``: the run is ending
        (the evaluator child is not checked any more)."""
        record = metrics_record(state=state, sps=lap.steps_per_s, ingest=counted, update_metrics=update_metrics,
                                hosts=hosts, selfplay=selfplay, update_s=update_s, clients_refused=clients_refused)
        record.update(self._read_evaluations(stopping=stopping))
        self.metrics.write(record)
        self.tracking.log(record)
        self.prometheus.observe_update(record=record, update_metrics=update_metrics, update_s=update_s,
                                       samples=self.samples_per_update)
        health = self.value_health.observe(explained_variance=update_metrics.get("explained_variance"),
                                           episode_returns=counted.recent_returns)
        self.prometheus.observe_value_health(health)
        if health.warning is not None:
            LOG.warning("%s", health.warning)
        saturation = self.saturation.observe(update_metrics.get("first_layer_frozen_frac"))
        if saturation.warning is not None:
            LOG.warning("%s", saturation.warning)
        self.progress.update(record)

    def _read_evaluations(self, *, stopping: bool) -> dict[str, float]:
        """The evaluations the child reported since the last update: a console line and Prometheus gauges each; the
        newest one's figures for this update's record (none without a new evaluation)."""
        if self.evaluator is None:
            return {}
        if not stopping:
            self.evaluator.check()
        figures: dict[str, float] = {}
        for record in self.evaluations.read_new():
            self.progress.event(evaluation_line(record))
            figures = evaluation_metrics(record)
            self.prometheus.observe_evaluation(figures)
        return figures
