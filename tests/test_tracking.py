"""Experiment tracking (learner/monitor/tracking.py): W&B offline and MLflow on a local file store.

Fast tests: the one record -> scalars mapping, the config keys, the one-line message for a backend switched on
without its package, and what a failing backend does (a warning, that backend off, no exception). Integration
tests (MLflow's client starts ``uname -p``; W&B starts wandb-core): a real MLflow store that cannot be made, or
goes away mid-run, is a warning and MLflow off; resume continues the MLflow run tracking.json names, or says it
starts a new one; CartPole trains a few updates with both switched on, is resumed, and everything is read back:
MLflow through MlflowClient on the file store, W&B from the offline runs' .wandb files, parsed with wandb's own
protobuf schema (wandb 0.31 ships no Python reader of that file any more; its framing is LevelDB's log format).
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from configs.loader import ConfigError, load_config
from configs.schema import RunConfig, RunSection
from learner.monitor.tensorboard_log import scalars_of, step_scalars
from learner.monitor.tracking import (IDS_FILE, Backend, MlflowBackend, Tracking, check_tracking, flat_params,
                                      missing_package_message, mlflow_uri)
from tests.processes import Run, metrics, start

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "defaults.yaml"
RECORD = {"update": 3, "env_steps": 96, "agent_steps": 192, "sps": 10.5, "episode_return_mean": None,
          "flag": True, "note": "text", "nan": float("nan"), "messages_dropped_by_reason": {"stale": 2, "absurd": 0},
          "control_rejected_by_reason": {}}


# ---------------------------------------------------------------- the record -> scalars mapping


def test_a_record_becomes_its_step_and_the_scalars_tensorboard_gets():
    step, scalars = step_scalars(RECORD)
    assert step == 192
    assert scalars == {"update": 3.0, "env_steps": 96.0, "agent_steps": 192.0, "sps": 10.5,
                       "messages_dropped_by_reason/stale": 2.0, "messages_dropped_by_reason/absurd": 0.0}
    assert scalars == dict(scalars_of(RECORD))  # the same pairs TensorBoardLog writes


def test_a_record_without_agent_steps_is_not_logged():
    assert step_scalars({"update": 1}) is None
    assert step_scalars({"update": 1, "agent_steps": True}) is None
    assert step_scalars({"update": 1, "agent_steps": 1.5}) is None


def test_tracking_with_no_backend_does_nothing():
    tracking = Tracking([])
    tracking.log(RECORD)
    tracking.finish(checkpoint=None, exit_code=0)


# ---------------------------------------------------------------- config and the missing-package message


def test_tracking_is_off_by_default_and_switched_on_by_keys():
    assert (RunConfig().run.wandb, RunConfig().run.mlflow) == (False, False)
    config = load_config(DEFAULTS, ["run.wandb=true", "run.mlflow=true", "run.tracking_dir=/tmp/t",
                                    "run.mlflow_tracking_uri=sqlite:///x.db"])
    assert config.run.wandb and config.run.mlflow and config.run.tracking_dir == "/tmp/t"
    with pytest.raises(ConfigError, match=r"run\.wandb"):
        load_config(DEFAULTS, ["run.wandb=maybe"])


def test_a_backend_switched_on_without_its_package_is_one_line_naming_the_extra():
    assert missing_package_message("wandb", "wandb") == (
        'run.wandb: true needs the wandb package, which is not installed: pip install -e ".[tracking]" '
        "(or set run.wandb: false)")
    for key in ("wandb", "mlflow"):
        with pytest.raises(ConfigError) as info:
            check_tracking(RunSection(**{key: True}), installed=lambda module: module != key)
        assert str(info.value) == missing_package_message(key, key) and "\n" not in str(info.value)
    check_tracking(RunSection(), installed=lambda module: False)  # off: nothing is needed
    check_tracking(RunSection(wandb=True, mlflow=True))  # both installed here (the test extra)
    with pytest.raises(ConfigError, match="run.mlflow_experiment must not be empty"):
        check_tracking(RunSection(mlflow=True, mlflow_experiment=" "))


def test_the_config_becomes_flat_params_and_the_default_uri_is_a_file_store_in_the_run_dir(tmp_path):
    params = flat_params(RunConfig())
    assert params["trainer.batch_size"] == "524288" and params["run.name"] == "run"
    assert params["model.cnn_channels"] == "[16, 16]" and params["run.wandb"] == "false"
    assert mlflow_uri(RunSection(), tmp_path) == (tmp_path / "mlruns").resolve().as_uri()
    assert mlflow_uri(RunSection(tracking_dir=str(tmp_path / "t")), tmp_path) == (tmp_path / "t" / "mlruns").as_uri()
    assert mlflow_uri(RunSection(mlflow_tracking_uri="sqlite:///m.db"), tmp_path) == "sqlite:///m.db"


# ---------------------------------------------------------------- failures: a warning, then that backend is off


class Failing(Backend):
    name = "Failing"

    def __init__(self) -> None:
        self.closed: list[int] = []

    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise OSError(28, "No space left on device")

    def close(self, exit_code: int) -> None:
        self.closed.append(exit_code)


def test_a_backend_that_fails_is_one_warning_and_off(caplog):
    failing = Failing()
    tracking = Tracking([failing])
    with caplog.at_level(logging.WARNING, logger="sluice.learner"):
        tracking.log(RECORD)
        tracking.log(RECORD)
        tracking.finish(checkpoint=None, exit_code=0)
    assert [r.getMessage() for r in caplog.records] == [
        "tracking: Failing failed to log (OSError: [Errno 28] No space left on device); Failing tracking is off "
        "for the rest of the run"]
    assert failing.closed == [1] and tracking.backends == []


@pytest.mark.integration  # MLflow runs uname -p (platform.processor)
def test_an_mlflow_store_that_cannot_be_made_is_a_warning_at_start(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    (tmp_path / "file").write_text("not a directory")
    config = RunConfig(run=RunSection(mlflow=True, tracking_dir=str(tmp_path / "file")))
    with caplog.at_level(logging.WARNING, logger="sluice.learner"):
        tracking = Tracking.start(config, tmp_path, resume=False, say=lambda line: None)
    assert tracking.backends == []
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith("tracking: MLflow failed to start (")
    assert "MLflow tracking is off for this run" in caplog.records[0].getMessage()


@pytest.mark.integration  # MLflow runs uname -p (platform.processor)
def test_an_mlflow_run_whose_store_goes_away_mid_run_turns_mlflow_off(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    config = RunConfig(run=RunSection(mlflow=True))
    said: list[str] = []
    tracking = Tracking.start(config, tmp_path, resume=False, say=said.append)
    assert len(tracking.backends) == 1 and isinstance(tracking.backends[0], MlflowBackend)
    assert json.loads((tmp_path / IDS_FILE).read_text())["mlflow_run_id"] == tracking.backends[0].id
    assert said and said[0].startswith(f"tracking: MLflow run {tracking.backends[0].id} (new) at file:")
    tracking.log(RECORD)
    shutil.rmtree(tmp_path / "mlruns")
    with caplog.at_level(logging.WARNING, logger="sluice.learner"):
        tracking.log(RECORD)  # no exception: training goes on
    assert tracking.backends == [] and "MLflow tracking is off for the rest of the run" in caplog.text


@pytest.mark.integration  # MLflow runs uname -p (platform.processor)
def test_resume_continues_the_mlflow_run_named_in_tracking_json_else_says_it_starts_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    config = RunConfig(run=RunSection(mlflow=True))
    said: list[str] = []
    Tracking.start(config, tmp_path, resume=True, say=said.append).finish(checkpoint=None, exit_code=0)
    first = json.loads((tmp_path / IDS_FILE).read_text())["mlflow_run_id"]
    assert said[0] == f"tracking: no MLflow run id in {tmp_path / IDS_FILE}: starting a new MLflow run"
    said.clear()
    tracking = Tracking.start(config, tmp_path, resume=True, say=said.append)
    assert said == [f"tracking: MLflow run {first} (continued) at {(tmp_path / 'mlruns').resolve().as_uri()}"]
    tracking.finish(checkpoint=None, exit_code=143)
    (tmp_path / IDS_FILE).write_text(json.dumps({"mlflow_run_id": "0" * 32}))
    said.clear()
    Tracking.start(config, tmp_path, resume=True, say=said.append).finish(checkpoint=None, exit_code=0)
    assert said[0] == f"tracking: MLflow run {'0' * 32} is not in {(tmp_path / 'mlruns').resolve().as_uri()}: " \
                      "starting a new MLflow run"
    assert json.loads((tmp_path / IDS_FILE).read_text())["mlflow_run_id"] not in (first, "0" * 32)


# ---------------------------------------------------------------- W&B's offline file: LevelDB log framing

BLOCK = 32768
HEADER = struct.Struct("<IHB")  # crc32 of type byte + data, length, type (1 full, 2 first, 3 middle, 4 last)


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a .wandb file as wandb's protobuf ``Record`` messages. The file starts with ":W&B", a 2-byte
    magic and a version byte; then LevelDB log records in 32 KiB blocks (a block's tail shorter than a header is
    zero padding), each checked against its CRC-32."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = 7, b""
    while pos + HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:
            pos += left
            continue
        crc, length, kind = HEADER.unpack_from(data, pos)
        if (crc, length, kind) == (0, 0, 0):  # padding to the block's end
            pos += left
            continue
        chunk = data[pos + HEADER.size:pos + HEADER.size + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"{path}: bad checksum at byte {pos}"
        pos += HEADER.size + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_history(path: Path) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    """The run record, the history rows ({key: value}) and the artifact records of one offline run file."""
    run, rows, artifacts = None, [], []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind == "artifact":
            artifacts.append(record.artifact)
    return run, rows, artifacts


# ---------------------------------------------------------------- a real run with both, resumed


@pytest.fixture
def tracked_run(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_DIR", "WANDB_PROJECT",
                 "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)  # the learner sets MLFLOW_ALLOW_FILE_STORE itself
    for name in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))  # W&B's staging and cache, kept out of $HOME
    run = Run(tmp_path, "--set", "run.wandb=true", "--set", "run.mlflow=true",
              "--set", "trainer.target_episode_return=null", "--set", "trainer.batch_size=2048",
              "--set", "trainer.minibatch_size=1024", "--set", "trainer.update_epochs=1",
              "--set", "trainer.num_workers=1", "--set", "run.checkpoint_interval=1")
    yield run
    run.close()


def _train(run: Run, *extra: str, log: str, resume: bool = False) -> None:
    if resume:  # the saved config, the same port
        learner = start("learner", "--resume", "--run-dir", str(run.run_dir), "--set", f"network.port={run.port}",
                        *extra, log=run.tmp / log)
        run.procs.append(learner)
    else:
        learner = run.learner(*extra, log=log)
    actors = run.actors(1, log=f"actors-{log}")
    assert learner.wait(timeout=180) == 0, run.log(log)
    assert actors.wait(timeout=60) == 0, run.log(f"actors-{log}")


def _check_mlflow(run_dir: Path, records: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> str:
    """MLflow's file store holds every record's scalars at its agent_steps, the config, the final checkpoint."""
    from mlflow.tracking import MlflowClient

    with monkeypatch.context() as patch:  # MLflow 3 opens a file store only with this (the learner sets its own)
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        return _read_mlflow(MlflowClient, run_dir, records)


def _read_mlflow(MlflowClient: Any, run_dir: Path, records: list[dict[str, Any]]) -> str:
    ids = json.loads((run_dir / IDS_FILE).read_text())
    assert ids["mlflow_tracking_uri"] == (run_dir / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=ids["mlflow_tracking_uri"])
    mlflow_run = client.get_run(ids["mlflow_run_id"])
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_name == run_dir.name
    expected = [step_scalars(record) for record in records]
    for key in ("policy_loss", "agent_steps", "update", "sps"):
        history = sorted(client.get_metric_history(mlflow_run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        assert [m.step for m in history] == [step for step, _ in expected], key
        assert [m.value for m in history] == pytest.approx([scalars[key] for _, scalars in expected]), key
    assert set(mlflow_run.data.metrics) == set().union(*(scalars for _, scalars in expected))
    params = mlflow_run.data.params
    assert params["trainer.batch_size"] == "2048" and params["run.mlflow"] == "true"
    assert params["env.name"] == "cartpole" and len(params) == len(flat_params(RunConfig()))
    final = sorted((run_dir / "checkpoints").iterdir())[-1]
    logged = {Path(item.path).name for item in client.list_artifacts(mlflow_run.info.run_id, "checkpoint")}
    assert logged == {path.name for path in final.iterdir()} and "model.safetensors" in logged
    return ids["mlflow_run_id"]


def _check_wandb(run_dir: Path, records: list[dict[str, Any]], *, files: int) -> str:
    """The offline run files hold the scalars of the records at their agent_steps, the config and the checkpoint."""
    ids = json.loads((run_dir / IDS_FILE).read_text())
    run_id = ids["wandb_run_id"]
    offline = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(offline) == files, list((run_dir / "wandb").iterdir())
    rows, artifacts = [], []
    for path in offline:
        run, more_rows, more_artifacts = wandb_history(path)
        assert run is not None and run.run_id == run_id and run.project == "sluice"
        assert run.display_name == run_dir.name
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        assert config["trainer"]["batch_size"] == 2048 and config["run"]["wandb"] is True
        rows += more_rows
        artifacts += more_artifacts
    assert [row["_step"] for row in rows] == [record["update"] for record in records]  # W&B's step: the update
    for row, record in zip(rows, records):  # the x axis: agent_steps, as TensorBoard's
        _, scalars = step_scalars(record)
        assert {key: value for key, value in row.items() if not key.startswith("_")} == pytest.approx(scalars)
        assert row["agent_steps"] == record["agent_steps"]
    assert len(artifacts) == files and all(a.type == "model" for a in artifacts)
    final = sorted((run_dir / "checkpoints").iterdir())[-1]
    assert {c.path for c in artifacts[-1].manifest.contents} == {path.name for path in final.iterdir()}
    return run_id


@pytest.mark.integration
def test_a_run_logs_to_wandb_offline_and_mlflow_and_resume_continues_both(tracked_run, monkeypatch):
    run = tracked_run
    _train(run, "--set", "trainer.total_timesteps=12288", log="first.log")
    first = metrics(run.run_dir)  # agent steps count every row received, so updates are not known in advance
    assert len(first) >= 2 and [r["update"] for r in first] == list(range(1, len(first) + 1))
    mlflow_id = _check_mlflow(run.run_dir, first, monkeypatch)
    wandb_id = _check_wandb(run.run_dir, first, files=1)
    out = run.log("first.log")
    assert f"tracking: W&B run {wandb_id} (new, offline)" in out and f"tracking: MLflow run {mlflow_id} (new)" in out
    assert "Traceback" not in out and "WARNING" not in out

    total = first[-1]["agent_steps"] + 4096
    _train(run, "--set", f"trainer.total_timesteps={total}", log="resumed.log", resume=True)
    records = metrics(run.run_dir)
    assert len(records) > len(first) and [r["update"] for r in records] == list(range(1, len(records) + 1))
    assert _check_mlflow(run.run_dir, records, monkeypatch) == mlflow_id
    assert _check_wandb(run.run_dir, records, files=2) == wandb_id
    out = run.log("resumed.log")
    assert f"tracking: W&B run {wandb_id} (continued, offline)" in out
    assert f"tracking: MLflow run {mlflow_id} (continued)" in out
    run.assert_clean()
