"""Config loading, validation, the batch plan and the learner CLI (errors name the key and what is allowed)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from configs.loader import ConfigError, config_to_dict, load_config, parse_override, shipped_config_names
from configs.plan import PlanError, make_plan
from configs.schema import RunConfig
from learner.cli import build_parser, main, package_version, selfplay_overrides
from learner.run.run_dir import RunDirError, new_run_dir, resume_config

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = REPO / "configs" / "defaults.yaml"
CARTPOLE = REPO / "configs" / "cartpole.yaml"

PLAN_3_AGENTS = {
    "num_agents": 3, "num_workers": 16, "target_batch_size": 1365, "batch_size_envs": 1360, "num_envs": 2720,
    "envs_per_worker": 170, "total_agents": 8160, "segments": 8192, "minibatch_segments": 256,
    "num_minibatches": 32, "steps_per_env": 192, "agent_steps_per_batch": 1572864,
    "gradient_updates_per_batch": 32, "experiences_per_gradient": 49152, "total_epochs": 19073,
}
PLAN_24_AGENTS = {
    "num_agents": 24, "target_batch_size": 170, "batch_size_envs": 160, "num_envs": 320, "envs_per_worker": 20,
    "total_agents": 7680, "segments": 8192, "minibatch_segments": 256, "num_minibatches": 32,
    "steps_per_env": 1638, "agent_steps_per_batch": 12582912, "gradient_updates_per_batch": 32,
    "experiences_per_gradient": 393216, "total_epochs": 19073,
}


def defaults(*overrides: str) -> RunConfig:
    return load_config(DEFAULTS, overrides)


def config_error(*overrides: str, path: Path = DEFAULTS) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- loading and overrides


def test_defaults_load_seed_values():
    config = defaults()
    assert config == RunConfig()  # defaults.yaml and the dataclass defaults agree
    t = config.trainer
    assert (t.batch_size, t.minibatch_size, t.bptt_horizon, t.num_workers) == (524288, 16384, 64, 16)
    assert (t.gamma, t.gae_lambda, t.clip_coef, t.learning_rate) == (0.977, 0.916, 0.1, 0.000457)
    assert t.target_episode_return is None and t.clip_vloss is True and t.lr_schedule == "cosine"
    assert config.run.device == "auto" and config.env.name == "cartpole" and config.env.kwargs == {}


def test_cartpole_config_loads_over_defaults():
    config = load_config(CARTPOLE)
    assert config == load_config(None)  # the embedded default run
    assert config.run.name == "cartpole" and config.run.checkpoint_interval == 20
    t = config.trainer
    assert (t.num_workers, t.batch_size, t.minibatch_size, t.bptt_horizon, t.update_epochs) == (2, 8192, 2048, 16, 4)
    assert t.gamma == 0.99 and t.target_episode_return == 475.0 and isinstance(t.target_episode_return, float)
    assert t.max_grad_norm == 0.5  # untouched keys keep the defaults
    plan = make_plan(t, num_agents=config.env.num_agents)
    assert plan.segments == 512 and plan.num_minibatches == 4


def test_set_overrides_int_float_bool_null():
    config = load_config(CARTPOLE, ["trainer.batch_size=16384", "trainer.gamma=0.5", "trainer.clip_vloss=false",
                                    "trainer.target_episode_return=null", "trainer.learning_rate=1",
                                    "run.name=abc", "env.num_agents=3"])
    t = config.trainer
    assert t.batch_size == 16384 and isinstance(t.batch_size, int)
    assert t.gamma == 0.5
    assert t.learning_rate == 1.0 and isinstance(t.learning_rate, float)  # int accepted for a float key
    assert t.clip_vloss is False and t.target_episode_return is None
    assert config.run.name == "abc" and config.env.num_agents == 3
    # later overrides win
    assert defaults("trainer.gamma=0.9", "trainer.gamma=0.8").trainer.gamma == 0.8


def test_parse_override():
    assert parse_override("trainer.gamma=0.9") == {"trainer": {"gamma": 0.9}}
    assert parse_override("trainer.target_episode_return=") == {"trainer": {"target_episode_return": None}}
    assert parse_override("run.name=a=b") == {"run": {"name": "a=b"}}


# ---------------------------------------------------------------- errors


def test_unknown_section_names_allowed_sections(tmp_path):
    msg = config_error("trainr.gamma=0.9")
    assert "unknown section 'trainr'" in msg and "did you mean 'trainer'" in msg
    assert "allowed: coma, env, evaluation, model, network, run, selfplay, trainer" in msg
    msg = config_error(path=write(tmp_path, "bogus:\n  a: 1\n"))
    assert "unknown section 'bogus'" in msg and "allowed: coma, env, evaluation, model, network, run, selfplay, trainer" in msg


def test_unknown_key_names_key_hint_and_allowed(tmp_path):
    msg = config_error("trainer.gama=0.9")
    assert "unknown key 'trainer.gama'" in msg and "did you mean 'gamma'" in msg
    assert "allowed:" in msg and "batch_size" in msg and "gae_lambda" in msg
    msg = config_error(path=write(tmp_path, "model:\n  hiden_size: 3\n"))
    assert "unknown key 'model.hiden_size'" in msg and "did you mean 'hidden_size'" in msg
    assert "allowed: cnn_channels, core, encoder, hidden_size, num_layers, obs_norm, shared_torso" in msg
    assert str(tmp_path / "run.yaml") in msg  # the source file is named


@pytest.mark.parametrize("override, expected", [
    ("trainer.batch_size=1.5", "trainer.batch_size: expected an integer, got 1.5"),
    ("trainer.batch_size=true", "trainer.batch_size: expected an integer, got True"),
    ("trainer.batch_size=big", "trainer.batch_size: expected an integer, got 'big'"),
    ("trainer.gamma=abc", "trainer.gamma: expected a finite number, got 'abc'"),
    ("trainer.gamma=true", "trainer.gamma: expected a finite number, got True"),
    ("trainer.gamma=.nan", "trainer.gamma: expected a finite number, got nan"),
    ("trainer.clip_vloss=1", "trainer.clip_vloss: expected true or false, got 1"),
    ("trainer.norm_adv=yes please", "trainer.norm_adv: expected true or false, got 'yes please'"),
    ("run.name=3", "run.name: expected a string, got 3"),
    ("env.kwargs=3", "env.kwargs: expected a mapping, got 3"),
    ("trainer.gamma=null", "trainer.gamma: a value is required (a number), got null"),
    ("trainer.batch_size=", "trainer.batch_size: a value is required (an integer), got null"),
])
def test_wrong_type(override, expected):
    assert expected in config_error(override)


def test_bad_choice_lists_choices():
    assert "run.device: 'gpu' is not allowed; allowed: auto, cpu, cuda" in config_error("run.device=gpu")
    for key in ("lr_schedule", "ent_coef_schedule", "clip_coef_schedule"):
        msg = config_error(f"trainer.{key}=exponential")
        assert f"trainer.{key}: 'exponential' is not allowed; allowed: constant, cosine, linear, logarithmic" in msg
    assert "allowed: adam, adamw" in config_error("trainer.optimizer=sgd")
    assert "allowed: default, reduce-overhead, max-autotune" in config_error("trainer.compile_mode=fast")
    assert "allowed: mlp, lstm" in config_error("model.core=gru")
    assert defaults("run.device=cpu").run.device == "cpu"


@pytest.mark.parametrize("override, expected", [
    ("trainer.gamma=1.5", "trainer.gamma: 1.5 is out of range; allowed: > 0.0 and <= 1.0"),
    ("trainer.gradient_accumulation=0", "trainer.gradient_accumulation: 0 is out of range; allowed: >= 1"),
    ("trainer.coef_rho_decay=1.5", "trainer.coef_rho_decay: 1.5 is out of range; allowed: >= 0.0 and <= 1.0"),
    ("trainer.kl_divergence_coef_rho=-1", "trainer.kl_divergence_coef_rho: -1.0 is out of range; allowed: >= 0.0"),
    ("trainer.vf_warmup=-2", "trainer.vf_warmup: -2 is out of range; allowed: >= 0"),
    ("trainer.gamma=0", "trainer.gamma: 0.0 is out of range; allowed: > 0.0 and <= 1.0"),
    ("trainer.batch_size=0", "trainer.batch_size: 0 is out of range; allowed: >= 1"),
    ("trainer.gae_lambda=-0.1", "trainer.gae_lambda: -0.1 is out of range"),
    ("trainer.prio_beta0=1.01", "trainer.prio_beta0: 1.01 is out of range"),
    ("network.port=65533", "network.port: 65533 is out of range; allowed: >= 1 and <= 65532"),
    ("network.metrics_port=70000", "network.metrics_port: 70000 is out of range; allowed: >= 0 and <= 65535"),
    ("env.num_agents=0", "env.num_agents: 0 is out of range"),
])
def test_out_of_range(override, expected):
    assert expected in config_error(override)


def test_bounds_are_inclusive_where_declared():
    assert defaults("trainer.gamma=1").trainer.gamma == 1.0
    assert defaults("trainer.gae_lambda=0").trainer.gae_lambda == 0.0
    assert defaults("trainer.max_policy_lag=0").trainer.max_policy_lag == 0


@pytest.mark.parametrize("text", ["trainer.gamma", "gamma=0.9", "trainer=0.9", ".gamma=1", "trainer.=1"])
def test_malformed_set(text):
    msg = config_error(text)
    assert f"--set {text!r}: expected section.key=value" in msg


def test_set_value_not_yaml():
    assert "is not valid YAML" in config_error("trainer.gamma=[1,")


def test_invalid_yaml_file(tmp_path):
    path = write(tmp_path, "trainer:\n  gamma: [0.9,\n")
    msg = config_error(path=path)
    assert str(path) in msg and "not valid YAML" in msg


def test_missing_file(tmp_path):
    msg = config_error(path=tmp_path / "nope.yaml")
    assert "config file not found" in msg and "nope.yaml" in msg


def test_top_level_not_a_mapping(tmp_path):
    msg = config_error(path=write(tmp_path, "- 1\n- 2\n"))
    assert "expected a mapping of sections at the top level, got list" in msg


def test_section_not_a_mapping(tmp_path):
    msg = config_error(path=write(tmp_path, "trainer: 3\n"))
    assert "section 'trainer' must be a mapping of keys, got 3" in msg


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# and another\n"])
def test_an_empty_or_comment_only_file_is_refused_naming_it(tmp_path, text):
    path = write(tmp_path, text)
    msg = config_error(path=path)
    assert msg == (f"{path}: the config file is empty (no sections, only blank lines or comments), so the run would "
                   "be configs/defaults.yaml's (trainer.total_timesteps 10,000,000,000); write the sections it "
                   "changes, e.g. 'trainer: {total_timesteps: 1000000}'")
    assert "\n" not in msg


def test_an_empty_file_refused_by_the_cli_in_one_line(tmp_path, capsys):
    path = write(tmp_path, "# nothing yet\n")
    assert main(["--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m learner: error: {path}: the config file is empty") and err.count("\n") == 1


def test_an_explicit_empty_mapping_is_still_the_defaults(tmp_path):
    assert load_config(write(tmp_path, "{}\n")) == RunConfig()


@pytest.mark.parametrize("value, expected", [("1e6", 1_000_000), ("1E6", 1_000_000), ("2.0", 2), ("1.5e6", 1_500_000),
                                             ("2.5e+3", 2500), ("1_000e3", 1_000_000), ("1e20", 10**20)])
def test_an_integer_key_takes_a_float_that_is_an_exact_integer(value, expected):
    total = defaults(f"trainer.total_timesteps={value}").trainer.total_timesteps
    assert total == expected and type(total) is int


def test_an_integer_key_in_yaml_takes_exponent_notation(tmp_path):
    config = load_config(write(tmp_path, "trainer:\n  total_timesteps: 1e6\n  batch_size: 8192.0\n"
                                         "  learning_rate: 3e-4\n"))
    assert (config.trainer.total_timesteps, config.trainer.batch_size) == (1_000_000, 8192)
    assert config.trainer.learning_rate == 3e-4 and type(config.trainer.learning_rate) is float


@pytest.mark.parametrize("value, shown", [("1.5", "1.5"), ("1.5e0", "1.5"), ("2.25e1", "22.5")])
def test_an_integer_key_refuses_a_fraction_saying_why(value, shown):
    assert config_error(f"trainer.total_timesteps={value}").endswith(
        f"trainer.total_timesteps: expected an integer, got {shown} (a whole number such as 1000000 or 1e6; "
        f"{shown} has a fractional part)")


def test_exponent_notation_beyond_a_float_is_refused():
    assert config_error("trainer.total_timesteps=1e400").endswith(
        "trainer.total_timesteps: '1e400' is too large a number; expected an integer")
    assert "expected an integer, got inf" in config_error("trainer.total_timesteps=.inf")


def test_a_number_key_takes_exponent_notation():
    assert defaults("trainer.learning_rate=3e-4").trainer.learning_rate == 3e-4
    assert defaults("trainer.target_episode_return=-1e2").trainer.target_episode_return == -100.0
    assert defaults("run.name=1e6").run.name == "1e6"  # a string key keeps the text


@pytest.mark.parametrize("key, kind", [("trainer.target_episode_return", "a number"),
                                       ("trainer.target_kl", "a number"), ("network.metrics_port", "an integer")])
@pytest.mark.parametrize("word", ["none", "None", "NONE"])
def test_none_for_a_key_that_allows_null_says_to_write_null(key, kind, word):
    assert config_error(f"{key}={word}").endswith(
        f"{key}: {word!r} is a string in YAML, not no value: write null (or ~) for no value, otherwise {kind}")
    assert getattr(defaults(f"{key}=null").trainer if key.startswith("trainer") else defaults(f"{key}=~").network,
                   key.split(".")[1]) is None


def test_none_in_a_yaml_file_says_to_write_null(tmp_path):
    msg = config_error(path=write(tmp_path, "trainer:\n  target_episode_return: None\n"))
    assert "trainer.target_episode_return: 'None' is a string in YAML, not no value: write null" in msg


# ---------------------------------------------------------------- plan constraints


def test_constraint_segments_at_least_total_agents():
    # defaults, 1 agent: 8192 envs; batch_size 262144 // 64 = 4096 segments < 8192 agents
    with pytest.raises(PlanError) as info:
        make_plan(defaults("trainer.batch_size=262144").trainer, num_agents=1)
    msg = str(info.value)
    assert "segments (4096 = batch_size 262144 // bptt_horizon 64) must be >= total agents" in msg
    assert "(8192 = 8192 envs x 1 agents)" in msg


def test_constraint_segments_divisible_by_minibatch_segments():
    with pytest.raises(PlanError) as info:
        make_plan(defaults("trainer.minibatch_size=192").trainer, num_agents=1)
    msg = str(info.value)
    assert "segments (8192 = batch_size 524288 // bptt_horizon 64)" in msg
    assert "divisible by minibatch_segments (3 = minibatch_size 192 // bptt_horizon 64): remainder 2" in msg


def test_constraint_minibatch_divisible_by_horizon():
    with pytest.raises(PlanError) as info:
        make_plan(defaults("trainer.minibatch_size=16001").trainer, num_agents=1)
    msg = str(info.value)
    assert "trainer.minibatch_size (16001) must be divisible by trainer.bptt_horizon (64): remainder 1" in msg


def test_constraint_gradient_accumulation_divides_minibatches():
    # defaults: 8192 segments // 256 minibatch segments = 32 minibatches per epoch
    with pytest.raises(PlanError) as info:
        make_plan(defaults("trainer.gradient_accumulation=3").trainer, num_agents=1)
    assert ("trainer.gradient_accumulation (3) must divide the minibatches per epoch (32 = segments 8192 // "
            "minibatch_segments 256)") in str(info.value)
    assert make_plan(defaults("trainer.gradient_accumulation=4").trainer, num_agents=1).num_minibatches == 32


def test_plan_errors_through_cli(capsys):
    code = main(["--config", str(DEFAULTS), "--set", "trainer.minibatch_size=192", "--plan"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m learner: error: ") and "remainder 2" in err


# ---------------------------------------------------------------- plan via the CLI


def plan_json(capsys, monkeypatch, agents: int) -> dict:
    monkeypatch.chdir(REPO)
    assert main(["--config", "configs/defaults.yaml", "--set", f"env.num_agents={agents}", "--plan", "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_plan_json_three_agents(capsys, monkeypatch):
    assert plan_json(capsys, monkeypatch, 3) == PLAN_3_AGENTS


def test_plan_json_twenty_four_agents(capsys, monkeypatch):
    plan = plan_json(capsys, monkeypatch, 24)
    assert {k: plan[k] for k in PLAN_24_AGENTS} == PLAN_24_AGENTS


def test_plan_table_prints_numbers(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["--config", "configs/defaults.yaml", "--set", "env.num_agents=3", "--plan"]) == 0
    table = capsys.readouterr().out
    values = {}
    for line in table.splitlines()[2:]:
        key, value = line.split()
        values[key] = int(value.replace(",", ""))
    assert values == PLAN_3_AGENTS
    assert "quantity" in table.splitlines()[0]


@pytest.mark.integration
def test_plan_subprocess():
    proc = subprocess.run([sys.executable, "-m", "learner", "--config", "configs/defaults.yaml",
                           "--set", "env.num_agents=3", "--plan", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == PLAN_3_AGENTS


# ---------------------------------------------------------------- CLI argument errors and run dirs


def cli_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("python -m learner: error: ")
    return captured.err


def test_json_without_plan(capsys):
    assert "--json only goes with --plan" in cli_error(capsys, ["--json"])


def test_resume_without_run_dir(capsys):
    assert "--resume needs --run-dir" in cli_error(capsys, ["--resume", "--plan"])


def test_resume_with_config(capsys, tmp_path):
    err = cli_error(capsys, ["--resume", "--run-dir", str(tmp_path), "--config", str(DEFAULTS), "--plan"])
    assert "drop --config" in err


def test_resume_missing_saved_config(capsys, tmp_path):
    err = cli_error(capsys, ["--resume", "--run-dir", str(tmp_path), "--plan"])
    assert "cannot resume" in err and "config.yaml" in err


def test_cli_config_error(capsys):
    err = cli_error(capsys, ["--config", str(DEFAULTS), "--set", "run.device=gpu", "--plan"])
    assert "run.device: 'gpu' is not allowed; allowed: auto, cpu, cuda" in err


def test_new_run_dir_roundtrips_config_and_resume(tmp_path, capsys):
    config = load_config(CARTPOLE, ["env.num_agents=2", "trainer.target_episode_return=null"])
    run_dir = new_run_dir(config, tmp_path / "run")
    assert (run_dir / "config.yaml").is_file()
    assert resume_config(run_dir, []) == config
    assert resume_config(run_dir, ["trainer.gamma=0.5"]).trainer.gamma == 0.5
    with pytest.raises(RunDirError, match="cannot resume from"):
        resume_config(run_dir, ["trainer.gama=0.5"])
    assert main(["--resume", "--run-dir", str(run_dir), "--plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == make_plan(config.trainer, num_agents=2).as_dict()


def test_run_dir_with_metrics_refuses_without_resume(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunDirError) as info:
        new_run_dir(RunConfig(), run_dir)
    assert "already holds a run" in str(info.value) and "--resume" in str(info.value)
    assert not (run_dir / "config.yaml").exists()


def test_run_dir_with_checkpoint_refuses(tmp_path):
    (tmp_path / "checkpoints" / "update_00000001").mkdir(parents=True)
    with pytest.raises(RunDirError, match="already holds a run"):
        new_run_dir(RunConfig(), tmp_path)



def test_env_name_choice_is_validated():
    allowed = "cartpole, gridworld, native, gymnasium, gymnasium_vector, pettingzoo, probe_truncation, probe_memory"
    assert f"allowed: {allowed}" in config_error("env.name=foo")


def test_seed_selfplay_flags_map_to_the_selfplay_section(capsys):
    args = build_parser().parse_args(["--per-env-opponent-sampling", "--opponent-pool-size", "12",
                                      "--opponent-pool-beta", "0.75", "--opponent-pool-exploration", "0.2"])
    overrides = selfplay_overrides(args)
    config = load_config(REPO / "configs/selfplay_connect4.yaml", overrides)
    section = config.selfplay
    assert section.enabled and section.per_env_opponent_sampling
    assert (section.opponent_pool_size, section.opponent_pool_beta, section.opponent_pool_exploration) == (12, 0.75, 0.2)
    err = cli_error(capsys, ["--config", str(REPO / "configs/selfplay_connect4.yaml"), "--opponent-pool-beta", "1.5",
                             "--plan"])
    assert "selfplay.opponent_pool_beta" in err and "1.5" in err
    err = cli_error(capsys, ["--config", str(CARTPOLE), "--per-env-opponent-sampling", "--plan"])
    assert "selfplay.enabled needs env.num_agents >= 2" in err
    with pytest.raises(ConfigError, match="selfplay.enabled needs model.core: mlp"):
        load_config(REPO / "configs/selfplay_connect4.yaml", ["model.core=lstm"])


# ---------------------------------------------------------------- nested --set, config names, --print-config, --version


def test_set_reaches_inside_a_mapping_valued_key(tmp_path):
    assert parse_override("env.kwargs.n=6") == {"env": {"kwargs": {"n": 6}}}
    run = write(tmp_path, "env:\n  name: native\n  entry_point: a:b\n  kwargs: {size: 3, track: {height: 2}}\n")
    config = load_config(run, ["env.kwargs.n=6", "env.kwargs.track.width=4"])
    assert config.env.kwargs == {"size": 3, "n": 6, "track": {"height": 2, "width": 4}}  # other keys kept
    assert load_config(run, ["env.kwargs={n: 6}"]).env.kwargs == {"n": 6}  # a whole mapping still replaces
    assert load_config(DEFAULTS, ["env.kwargs.a.b=x"]).env.kwargs == {"a": {"b": "x"}}


def test_set_inside_a_key_that_is_not_a_mapping_is_an_error():
    assert config_error("env.num_agents.x=1") == ("--set env.num_agents.x=1: 'env.num_agents' is not a mapping, so it "
                                                  "has no keys inside it; keys that hold a mapping: env.kwargs, "
                                                  "env.tokens, selfplay.baseline_opponents")
    err = config_error("env.kwargs.n=6", "env.kwargs.n.m=1")
    assert "'env.kwargs.n' is 6, not a mapping" in err
    assert "unknown key 'env.kwarg'" in config_error("env.kwarg.n=6")
    assert "unknown section 'nv'" in config_error("nv.kwargs.n=6")


@pytest.mark.integration
def test_a_config_name_finds_the_shipped_file_from_any_directory(tmp_path):
    done = subprocess.run([sys.executable, "-m", "learner", "--config", "selfplay_connect4", "--print-config"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == config_to_dict(load_config(REPO / "configs" / "selfplay_connect4.yaml"))


def test_an_unknown_config_name_lists_the_shipped_ones(capsys):
    assert {"cartpole", "selfplay_connect4", "grid_3agents"} <= set(shipped_config_names())
    err = cli_error(capsys, ["--config", "cartpol", "--plan"])
    assert "--config 'cartpol': no such file and no shipped config of that name" in err
    assert f"shipped configs: {', '.join(shipped_config_names())}" in err
    err = cli_error(capsys, ["--config", "missing/run.yaml", "--plan"])
    assert "config file not found: missing/run.yaml" in err


def test_print_config_prints_the_resolved_config_as_yaml(capsys, tmp_path):
    run = write(tmp_path, "trainer:\n  gamma: 0.9\n")
    assert main(["--config", str(run), "--set", "env.kwargs.n=6", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == config_to_dict(load_config(run, ["env.kwargs.n=6"]))
    assert printed["trainer"]["gamma"] == 0.9 and printed["env"]["kwargs"] == {"n": 6}


def test_version_prints_the_package_version(capsys, monkeypatch):
    pyproject_version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    try:
        expected = importlib.metadata.version("sluice")
    except importlib.metadata.PackageNotFoundError:
        expected = pyproject_version
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"python -m learner {expected}\n"

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert package_version() == pyproject_version
