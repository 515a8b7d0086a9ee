"""Experiment tracking: Weights & Biases (offline) and MLflow (a local file store by default), each optional.

Switched on in the config (``run.wandb: true``, ``run.mlflow: true``; configs/schema.py RunSection). Only the learner
(rank 0 of a data-parallel learner) logs; follower ranks never build a tracker. What each backend gets:

- every update, the scalars TensorBoard gets, against the same x axis (agent_steps): the one mapping of a
  metrics.jsonl record to scalars is learner/monitor/tensorboard_log.py's ``step_scalars``. MLflow's step is
  agent_steps; W&B's own step is the update (W&B merges rows logged at an equal step, and an update can add no
  agent steps), its charts' x axis agent_steps (``define_metric``);
- at the start, the resolved config: W&B's run config (nested by section), MLflow params ("section.key");
- at the end, the final checkpoint: an MLflow artifact directory ``checkpoint/``, a W&B Artifact of type model.

W&B runs with ``mode="offline"`` (files under <tracking_dir>/wandb/, ``wandb sync`` uploads them later) unless the
environment sets WANDB_MODE. MLflow's default tracking URI is ``file:<tracking_dir>/mlruns``; MLflow 3 refuses its
file store unless MLFLOW_ALLOW_FILE_STORE is true, so a ``file:`` URI sets it for this process when the environment
does not (``mlflow ui --backend-store-uri <that URI>`` needs it too).

wandb and mlflow are imported only when switched on; one that is switched on but not installed is a ConfigError at
start naming the extra to install (``check_tracking``). A backend that fails while the run goes on (a full disk, a
server gone) is one warning line, and that backend is off for the rest of the run; training never stops for it.

--resume continues the same runs: their ids are kept in <run dir>/tracking.json; without one (tracking switched on
at resume, a lost file, an MLflow run that is gone) the resumed run says so and starts a new run. The updates a
crashed process logged after its last checkpoint are logged again (W&B and MLflow keep both; TensorBoard hides the
older ones).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from configs.loader import ConfigError, config_to_dict
from configs.schema import RunConfig, RunSection
from learner.monitor.tensorboard_log import STEP_KEY, step_scalars
from learner.run.atomic import atomic_write_text

LOG = logging.getLogger("sluice.learner")

EXTRA = "tracking"
"""The project's extra that installs wandb and mlflow (pyproject.toml)."""
IDS_FILE = "tracking.json"
"""In the run directory: the W&B run id and the MLflow run id (and its tracking URI), for --resume."""
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
"""Config key -> the module it imports."""
MLFLOW_BATCH = 100
"""Params per MLflow log_batch call (its limit); metrics go at most 1000 a call, so one record is one call."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_package_message(key: str, module: str) -> str:
    """The one line for a backend switched on without its package."""
    return (f"run.{key}: true needs the {module} package, which is not installed: "
            f"pip install -e \".[{EXTRA}]\" (or set run.{key}: false)")


def check_tracking(run: RunSection, *, installed: Callable[[str], bool] = _installed) -> None:
    """ConfigError (one line) when a backend is switched on but its package is missing, or its names are empty;
    nothing is imported."""
    for key, module in PACKAGES.items():
        if getattr(run, key) and not installed(module):
            raise ConfigError(missing_package_message(key, module))
    if run.wandb and not run.wandb_project.strip():
        raise ConfigError("run.wandb_project must not be empty with run.wandb: true")
    if run.mlflow and not run.mlflow_experiment.strip():
        raise ConfigError("run.mlflow_experiment must not be empty with run.mlflow: true")


def flat_params(config: RunConfig) -> dict[str, str]:
    """The resolved config as MLflow params: "section.key" -> the value (lists and mappings as JSON)."""
    params = {}
    for section, values in config_to_dict(config).items():
        for key, value in values.items():
            params[f"{section}.{key}"] = value if isinstance(value, str) else json.dumps(value)
    return params


def tracking_dir(run: RunSection, run_dir: Path) -> Path:
    """Where the backends' local files go: run.tracking_dir, or the run directory."""
    return Path(run.tracking_dir) if run.tracking_dir else run_dir


def mlflow_uri(run: RunSection, run_dir: Path) -> str:
    """run.mlflow_tracking_uri, or the file store <tracking_dir>/mlruns as a file: URI."""
    if run.mlflow_tracking_uri:
        return run.mlflow_tracking_uri
    return (tracking_dir(run, run_dir) / "mlruns").resolve().as_uri()


def read_ids(run_dir: Path) -> dict[str, Any]:
    """The ids tracking.json keeps ({} without a readable one)."""
    try:
        data = json.loads((run_dir / IDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class Backend:
    """One tracking service. Every method may raise; Tracking turns that into one warning and drops the backend."""

    name = ""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def log_checkpoint(self, checkpoint: Path) -> None:
        raise NotImplementedError

    def close(self, exit_code: int) -> None:
        raise NotImplementedError


class WandbBackend(Backend):
    """A W&B run, offline unless WANDB_MODE says otherwise."""

    name = "W&B"

    def __init__(self, config: RunConfig, run_dir: Path, *, run_id: str | None, say: Callable[[str], None]) -> None:
        import wandb

        self.wandb = wandb
        directory = tracking_dir(config.run, run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        mode = {} if os.environ.get("WANDB_MODE") else {"mode": "offline"}
        resume = {"id": run_id, "resume": "allow"} if run_id else {}
        self.run = wandb.init(project=config.run.wandb_project, name=run_dir.name, dir=str(directory),
                              config=config_to_dict(config), **mode, **resume,
                              settings=wandb.Settings(console="off", silent=True, save_code=False,
                                                      disable_job_creation=True))
        self.id = self.run.id
        self.run.define_metric("*", step_metric=STEP_KEY)
        say(f"tracking: W&B run {self.id} ({'continued' if run_id else 'new'}, "
            f"{os.environ.get('WANDB_MODE') or 'offline'}) in {Path(self.run.dir).parent}")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """W&B's own step is the update (it merges rows logged at an equal step, and an update may add no agent
        steps); the charts' x axis is agent_steps, as TensorBoard's (define_metric at start)."""
        update = scalars.get("update")
        self.run.log(scalars, **({"step": int(update)} if update is not None else {}))

    def log_checkpoint(self, checkpoint: Path) -> None:
        artifact = self.wandb.Artifact(f"checkpoint-{self.id}", type="model",
                                       metadata={"checkpoint": checkpoint.name})
        for path in sorted(checkpoint.rglob("*")):  # file by file: add_dir prints a line of its own
            if path.is_file():
                artifact.add_file(str(path), name=path.relative_to(checkpoint).as_posix())
        self.run.log_artifact(artifact, aliases=["latest", "final"])

    def close(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)


class MlflowBackend(Backend):
    """An MLflow run through MlflowClient (no global active run)."""

    name = "MLflow"

    def __init__(self, config: RunConfig, run_dir: Path, *, run_id: str | None, say: Callable[[str], None]) -> None:
        self.uri = mlflow_uri(config.run, run_dir)
        if self.uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses the file store without it
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=self.uri)
        params = flat_params(config)
        existing = self._existing(run_id) if run_id else None
        if run_id and existing is None:
            say(f"tracking: MLflow run {run_id} is not in {self.uri}: starting a new MLflow run")
        if existing is not None:
            self.id = run_id
            self.client.update_run(run_id, status="RUNNING")
            changed = {key: value for key, value in params.items() if key in existing and existing[key] != value}
            params = {key: value for key, value in params.items() if key not in existing}
            for key, value in changed.items():  # a param cannot change: a --set at resume goes to a tag
                self.client.set_tag(run_id, f"resumed.{key}", value)
        else:
            experiment = self.client.get_experiment_by_name(config.run.mlflow_experiment)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment(config.run.mlflow_experiment))
            self.id = self.client.create_run(experiment_id, run_name=run_dir.name,
                                             tags={"sluice.run_dir": str(run_dir.resolve())}).info.run_id
        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.id, params=items[start:start + MLFLOW_BATCH])
        say(f"tracking: MLflow run {self.id} ({'continued' if existing is not None else 'new'}) at {self.uri}")

    def _existing(self, run_id: str) -> dict[str, str] | None:
        """The params of the run ``run_id`` (None if the store has no such run)."""
        from mlflow.exceptions import MlflowException

        try:
            return dict(self.client.get_run(run_id).data.params)
        except MlflowException:
            return None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.id, metrics=[self.Metric(key, value, now, step) for key, value in scalars.items()])

    def log_checkpoint(self, checkpoint: Path) -> None:
        self.client.log_artifacts(self.id, str(checkpoint), artifact_path="checkpoint")

    def close(self, exit_code: int) -> None:
        status = "FINISHED" if exit_code == 0 else "KILLED" if exit_code > 128 else "FAILED"
        self.client.set_terminated(self.id, status=status)


class Tracking:
    """The enabled backends of one run (none: every call does nothing)."""

    def __init__(self, backends: list[Backend], *, run_dir: Path | None = None) -> None:
        self.backends = backends
        self.run_dir = run_dir

    @classmethod
    def start(cls, config: RunConfig, run_dir: Path, *, resume: bool,
              say: Callable[[str], None] = LOG.info) -> Tracking:
        """Start each switched-on backend (continuing the run tracking.json names on --resume); one that fails to
        start is one warning and off. The ids are written to <run_dir>/tracking.json."""
        if not (config.run.wandb or config.run.mlflow):
            return cls([])
        saved = read_ids(run_dir) if resume else {}
        backends: list[Backend] = []
        if config.run.wandb:
            run_id = saved.get("wandb_run_id") if isinstance(saved.get("wandb_run_id"), str) else None
            if resume and run_id is None:
                say(f"tracking: no W&B run id in {run_dir / IDS_FILE}: starting a new W&B run")
            backend = _started("W&B", lambda: WandbBackend(config, run_dir, run_id=run_id, say=say))
            backends += [backend] if backend is not None else []
        if config.run.mlflow:
            run_id = saved.get("mlflow_run_id") if isinstance(saved.get("mlflow_run_id"), str) else None
            if resume and run_id is None:
                say(f"tracking: no MLflow run id in {run_dir / IDS_FILE}: starting a new MLflow run")
            backend = _started("MLflow", lambda: MlflowBackend(config, run_dir, run_id=run_id, say=say))
            backends += [backend] if backend is not None else []
        tracking = cls(backends, run_dir=run_dir)
        tracking._write_ids(saved)
        return tracking

    def _write_ids(self, saved: dict[str, Any]) -> None:
        ids = dict(saved)
        for backend in self.backends:
            if isinstance(backend, WandbBackend):
                ids["wandb_run_id"] = backend.id
            elif isinstance(backend, MlflowBackend):
                ids.update(mlflow_run_id=backend.id, mlflow_tracking_uri=backend.uri)
        if self.run_dir is not None and ids and ids != saved:
            try:
                atomic_write_text(self.run_dir / IDS_FILE, json.dumps(ids, indent=1) + "\n")
            except OSError as err:  # --resume then starts new runs; training goes on
                LOG.warning("tracking: cannot write %s (%s); --resume will start new runs", self.run_dir / IDS_FILE,
                            err)

    def log(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl record's scalars, at its agent_steps (a record without them is skipped)."""
        if not self.backends:
            return
        logged = step_scalars(record)
        if logged is not None:
            step, scalars = logged
            self._each("log", lambda backend: backend.log(step, scalars))

    def finish(self, *, checkpoint: Path | None, exit_code: int) -> None:
        """The final checkpoint (None: none was written) as an artifact, then each run closed."""
        if checkpoint is not None:
            self._each("log the checkpoint", lambda backend: backend.log_checkpoint(checkpoint))
        self._each("finish", lambda backend: backend.close(exit_code))
        self.backends = []

    def _each(self, what: str, call: Callable[[Backend], None]) -> None:
        for backend in list(self.backends):
            try:
                call(backend)
            except Exception as err:  # noqa: BLE001 (a tracker never stops training)
                self.backends.remove(backend)
                LOG.warning("tracking: %s failed to %s (%s: %s); %s tracking is off for the rest of the run",
                            backend.name, what, type(err).__name__, _one_line(err), backend.name)
                if what != "finish":
                    try:
                        backend.close(1)
                    except Exception:  # noqa: BLE001
                        pass


def _started(name: str, make: Callable[[], Backend]) -> Backend | None:
    try:
        return make()
    except Exception as err:  # noqa: BLE001 (a tracker never stops training)
        LOG.warning("tracking: %s failed to start (%s: %s); %s tracking is off for this run", name,
                    type(err).__name__, _one_line(err), name)
        return None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."
