"""The operations side of the Prometheus metrics: ops/prometheus (scrape config, alerts and their promtool unit
tests) and ops/grafana (dashboard and provisioning).

Every metric an alert or a dashboard panel queries must be one the exporters register, so renaming a metric
in the code breaks this test rather than silently emptying a panel or muting an alert. The promtool checks
run for real where promtool is installed (``bash ops/setup.sh`` as root installs Debian's ``prometheus``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS_DIR = REPO / "ops" / "prometheus"
GRAFANA_DIR = REPO / "ops" / "grafana"
DATASOURCE_UID = "sluice-prometheus"
"""The uid the provisioned datasource has and every dashboard panel and target names."""

PROMETHEUS_OWN_METRICS = {"up"}
"""Series Prometheus itself writes for each target, allowed although no Sluice exporter registers them."""

PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "inf", "nan",
}
"""PromQL keywords that look like identifiers (functions and aggregations are recognised by their '(')."""

HISTOGRAM_SAMPLE_SUFFIX = re.compile(r"_(bucket|sum|count)$")
LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression queries, with a histogram's _bucket/_sum/_count sample suffix
    stripped to its family name (functions, keywords, label matchers, label lists, durations, numbers, strings
    and Grafana $variables left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', " ", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = LABEL_LIST.sub(" ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    text = re.sub(r"(?<![\w:])\d[\w.]*", " ", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        name = match.group()
        if name.lower() in PROMQL_WORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(HISTOGRAM_SAMPLE_SUFFIX.sub("", name))
    return names


def exported_metric_names() -> set[str]:
    """Every sample name the learner, actor host and pool server export, histogram suffixes stripped."""
    from actors.host_metrics import HostMetrics
    from learner.pool.metrics import PoolMetrics
    from learner.monitor.prometheus_metrics import LearnerMetrics, RunCounts
    from telemetry.registry import metric_names, new_registry

    learner_registry = new_registry("learner")
    # The counts read at every scrape (steps, drops, hosts, ...) are registered by watch(); empty readers suffice.
    LearnerMetrics(learner_registry).watch(RunCounts.empty())
    host_registry = new_registry("actor_host")
    HostMetrics(host_registry)
    pool_registry = new_registry("pool_server")
    PoolMetrics(pool_registry)
    exported = set().union(*(metric_names(registry) for registry in (learner_registry, host_registry, pool_registry)))
    return exported | {HISTOGRAM_SAMPLE_SUFFIX.sub("", name) for name in exported}


def alert_rules() -> list[dict]:
    """The rules of ops/prometheus/alerts.yml, every group's."""
    document = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard() -> dict:
    """ops/grafana/sluice.json, parsed."""
    return json.loads((GRAFANA_DIR / "sluice.json").read_text())


def all_panels(board: dict) -> list[dict]:
    """Every panel of the dashboard: rows, the panels between them and those nested in collapsed rows."""
    return [nested for panel in board["panels"] for nested in [panel, *panel.get("panels", [])]]


def query_panels(board: dict) -> list[dict]:
    """The dashboard's panels that show data (rows, which only group panels, left out)."""
    return [panel for panel in all_panels(board) if panel.get("type") != "row"]


def dashboard_exprs() -> list[str]:
    """Every target expression of the dashboard."""
    return [target["expr"] for panel in query_panels(dashboard()) for target in panel["targets"]]


def test_extractor_finds_metric_names_and_skips_promql_syntax():
    expr = ('histogram_quantile(0.9, sum by (job, instance, le) (rate(sluice_made_up_seconds_bucket'
            '{job="sluice_learner", le!="+Inf"}[5m]))) > on (job, instance) 0.8 * sluice_made_up_max'
            ' and time() - sluice_made_up_timestamp offset 1h > 1e3 or rate(other_total[$__rate_interval])')
    assert promql_metric_names(expr) == {"sluice_made_up_seconds", "sluice_made_up_max",
                                         "sluice_made_up_timestamp", "other_total"}


def test_extractor_reports_a_name_no_exporter_registers():
    unknown = promql_metric_names("increase(sluice_not_exported_total[10m]) > 0") - exported_metric_names()
    assert unknown == {"sluice_not_exported_total"}


def test_every_alert_queries_exported_metrics():
    exported = exported_metric_names() | PROMETHEUS_OWN_METRICS
    unknown = {rule["alert"]: sorted(promql_metric_names(rule["expr"]) - exported) for rule in alert_rules()}
    assert {alert: names for alert, names in unknown.items() if names} == {}


def test_every_dashboard_target_queries_exported_metrics():
    exported = exported_metric_names() | PROMETHEUS_OWN_METRICS
    unknown = {expr: sorted(promql_metric_names(expr) - exported) for expr in dashboard_exprs()}
    assert {expr: names for expr, names in unknown.items() if names} == {}


def test_every_alert_has_severity_summary_and_description():
    rules = alert_rules()
    assert rules, "alerts.yml has no rules"
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_every_alert_is_exercised_by_the_promtool_tests():
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
    checks = [check for test in tests for check in test["alert_rule_test"]]
    fired = {check["alertname"] for check in checks if check["exp_alerts"]}
    quiet = {check["alertname"] for check in checks if not check["exp_alerts"]}
    alerts = {rule["alert"] for rule in alert_rules()}
    assert (alerts - fired, alerts - quiet) == (set(), set())


def test_dashboard_panels_have_titles_targets_and_unique_ids():
    board = dashboard()
    assert board["uid"] and board["title"]
    for panel in all_panels(board):
        assert panel.get("title"), f"panel {panel.get('id')} has no title"
    panels = query_panels(board)
    for panel in panels:
        assert panel.get("targets"), f"panel {panel['title']!r} has no targets"
        assert panel["datasource"]["uid"] == DATASOURCE_UID, panel["title"]
        assert all(target["datasource"]["uid"] == DATASOURCE_UID for target in panel["targets"]), panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"panel {panel['title']!r} repeats a refId: {ref_ids}"
    ids = [panel["id"] for panel in all_panels(board)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"


def test_grafana_provisioning_names_the_dashboard_datasource():
    datasources = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert [source["uid"] for source in datasources["datasources"]] == [DATASOURCE_UID]
    providers = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "sluice.yml").read_text())
    assert [provider["options"]["path"] for provider in providers["providers"]] == ["$SLUICE_DIR/ops/grafana"]


def test_scrape_config_has_the_catalogue_jobs():
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == ["sluice_actor_hosts", "sluice_learner", "sluice_pool_server"]
    assert config["rule_files"] == ["alerts.yml"]
    for files in (sd["files"] for sd in jobs["sluice_pool_server"]["file_sd_configs"]):
        for name in files:
            assert json.loads((PROMETHEUS_DIR / name).read_text()) == []


def promtool() -> str:
    """promtool's path; skips the test where it is missing, unless CI is set (CI must run the promtool checks)."""
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool missing: run bash ops/setup.sh as root (installs Debian's prometheus)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.mark.integration
@pytest.mark.parametrize("arguments", [
    ("check", "config", "prometheus.yml"),
    ("check", "rules", "alerts.yml"),
    ("test", "rules", "alerts_test.yml"),
], ids=" ".join)
def test_promtool_accepts(arguments):
    result = subprocess.run([promtool(), *arguments], cwd=PROMETHEUS_DIR, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, f"promtool {' '.join(arguments)}:\n{result.stdout}\n{result.stderr}"


# ---------------------------------------------------------------- the dashboard's run and instance variables

GRAFANA_VARIABLES = ("run", "instance")
"""Template variables every query filters on, so two runs (or two learners) on one Prometheus are not mixed."""

SELECTOR = re.compile(r'(?<![\w:$"])([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?')


def unfiltered_selectors(expr: str) -> list[str]:
    """The metric selectors of ``expr`` that do not match on every GRAFANA_VARIABLES label (label=~"$label")."""
    names = promql_metric_names(expr)
    missing = []
    for match in SELECTOR.finditer(expr):
        name, matchers = match.group(1), match.group(2) or ""
        if HISTOGRAM_SAMPLE_SUFFIX.sub("", name) not in names:
            continue
        if not all(f'{label}=~"${label}"' in matchers for label in GRAFANA_VARIABLES):
            missing.append(match.group())
    return missing


def test_the_selector_check_finds_an_unfiltered_metric():
    assert unfiltered_selectors('sum(rate(sluice_a_total{job="x", run=~"$run", instance=~"$instance"}[5m])) '
                                '/ sum(rate(sluice_b_total{job="x", run=~"$run"}[5m])) + up') == [
        'sluice_b_total{job="x", run=~"$run"}', "up"]


def test_every_dashboard_query_filters_on_the_run_and_instance_variables():
    exprs = dashboard_exprs()
    assert exprs
    assert {expr: unfiltered_selectors(expr) for expr in exprs if unfiltered_selectors(expr)} == {}


def test_the_dashboard_defines_the_run_and_instance_variables():
    variables = {variable["name"]: variable for variable in dashboard()["templating"]["list"]}
    assert tuple(variables) == GRAFANA_VARIABLES
    for name, variable in variables.items():
        assert variable["type"] == "query" and variable["datasource"]["uid"] == DATASOURCE_UID, name
        # All (the default) matches every series, those without the label too (the shipped prometheus.yml's)
        assert variable["includeAll"] and variable["allValue"] == ".*", name
        assert variable["current"]["value"] == ["$__all"], name
        assert variable["query"]["query"] == variable["definition"], name
        assert variable["definition"].startswith("label_values(") and variable["definition"].endswith(f", {name})")
        selector = variable["definition"].removeprefix("label_values(").removesuffix(f", {name})")
        assert promql_metric_names(selector) == {"up"}, name  # every target has up, whatever it exports
    assert 'run=~"$run"' in variables["instance"]["definition"]  # the instances of the chosen runs


# ---------------------------------------------------------------- python -m learner --print-prometheus-config


def printed_scrape_config(capsys, *args: str) -> tuple[str, dict]:
    from learner.cli import main

    assert main(["--print-prometheus-config", *args]) == 0
    text = capsys.readouterr().out
    return text, yaml.safe_load(text)


def test_printed_scrape_config_is_the_shipped_one_at_the_runs_ports(capsys, tmp_path):
    from learner.monitor.metrics_endpoint import DISCOVERY_PATH

    _, config = printed_scrape_config(capsys, "--set", "network.metrics_port=9123", "--run-dir",
                                      str(tmp_path / "cartpole-a"))
    shipped = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["global"] == shipped["global"]
    assert config["rule_files"] == [str(PROMETHEUS_DIR / name) for name in shipped["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == sorted(f"{job['job_name']}-cartpole-a" for job in shipped["scrape_configs"])
    for job in shipped["scrape_configs"]:  # the job label stays the one the alerts and the dashboard query
        assert jobs[f"{job['job_name']}-cartpole-a"]["relabel_configs"] == [
            {"target_label": "job", "replacement": job["job_name"]},
            {"target_label": "run", "replacement": "cartpole-a"}]
    assert jobs["sluice_learner-cartpole-a"]["static_configs"] == [{"targets": ["127.0.0.1:9123"]}]
    assert jobs["sluice_actor_hosts-cartpole-a"]["http_sd_configs"] == [
        {"url": f"http://127.0.0.1:9123{DISCOVERY_PATH}", "refresh_interval": "5s"}]
    assert jobs["sluice_pool_server-cartpole-a"]["file_sd_configs"] == [
        {"files": [str(PROMETHEUS_DIR / "targets" / "pool_server.json")]}]


def test_printed_scrape_config_follows_network_port_and_run_name(capsys):
    text, config = printed_scrape_config(capsys, "--set", "network.port=6000", "--set", "run.name=exp1")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["sluice_learner-exp1"]["static_configs"] == [{"targets": ["127.0.0.1:6003"]}]
    assert text.startswith("# Prometheus config for Sluice run 'exp1': the learner's metrics at 127.0.0.1:6003")


def test_printed_scrape_config_for_a_learner_on_every_interface_uses_loopback_and_says_so(capsys):
    text, config = printed_scrape_config(capsys, "--set", "network.metrics_host=0.0.0.0", "--insecure")
    learner_job = next(job for job in config["scrape_configs"] if job["job_name"].startswith("sluice_learner-"))
    assert learner_job["static_configs"] == [{"targets": ["127.0.0.1:5558"]}]
    assert "# The learner binds every interface (0.0.0.0): from another machine, replace 127.0.0.1" in text


def test_printed_scrape_config_needs_a_fixed_metrics_port(capsys):
    from learner.cli import main

    assert main(["--print-prometheus-config", "--set", "network.metrics_port=0"]) == 2
    assert capsys.readouterr().err == (
        "python -m learner: error: network.metrics_port is 0 (a free port chosen at start, unknown until then): give "
        "the run a fixed one with --set network.metrics_port=PORT\n")


@pytest.mark.integration
def test_promtool_accepts_the_printed_scrape_config(capsys, tmp_path):
    text, _ = printed_scrape_config(capsys, "--set", "network.metrics_port=9123", "--set", "run.name=a")
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    result = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, f"promtool check config:\n{result.stdout}\n{result.stderr}"
