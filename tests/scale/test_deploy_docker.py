"""docker/ as shipped: secrets from docker/.env and a compose secret (never literals), the servers' token and
gRPC health check, Grafana without anonymous access, loopback-published ports, the alert rules (promtool:
syntax and unit tests) and a dashboard parameterized by job and server."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from mneme.cli import build_parser

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def generator():
    spec = importlib.util.spec_from_file_location("generate_stack", DOCKER / "generate_stack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def servers() -> dict[str, dict]:
    return {n: s for n, s in compose()["services"].items() if n.startswith("replay-server-gpu")}


def test_no_secret_is_a_literal():
    text = (DOCKER / "docker-compose.yml").read_text()
    assert "mneme-secret" not in text and "admin}" not in text.replace("GRAFANA_ADMIN_USER:-admin}", "")
    services = compose()["services"]
    for name in ("minio", "create-bucket"):
        assert services[name]["environment"]["MINIO_ROOT_PASSWORD"].startswith("${MINIO_ROOT_PASSWORD:?")
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "${GRAFANA_ANONYMOUS:-false}"
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("${MNEME_PUBLISH_ADDRESS:-127.0.0.1}:"), port


def test_servers_require_the_token_and_report_health_over_grpc():
    stack = compose()
    assert stack["secrets"] == {"mneme-token": {"file": "./secrets/mneme-token"}}
    for name, server in servers().items():
        args = build_parser("serve").parse_args(server["command"][1:])
        assert args.token_file == "/run/secrets/mneme-token" and server["secrets"] == ["mneme-token"]
        assert not args.insecure
        check = server["healthcheck"]["test"]
        assert check[:4] == ["CMD", "python3", "-m", "replay_server.probe"]
        assert check[check.index("--address") + 1] == f"127.0.0.1:{args.port}"
        assert ":latest" not in server["image"]
    assert "dcgm" in stack["services"]["dcgm-exporter"]["profiles"]


def test_secrets_are_made_once_and_private(tmp_path):
    gen = generator()
    env, folder = tmp_path / ".env", tmp_path / "secrets"
    env.write_text("MINIO_ROOT_USER=me\n")
    created = gen.write_secrets(env, folder)
    assert set(created) == {".env: MINIO_ROOT_PASSWORD", ".env: GRAFANA_ADMIN_PASSWORD", "secrets/mneme-token"}
    values = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert values["MINIO_ROOT_USER"] == "me" and len(values["MINIO_ROOT_PASSWORD"]) >= 24
    assert stat.S_IMODE(env.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    token = (folder / "mneme-token").read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", token)
    assert gen.write_secrets(env, folder) == [] and (folder / "mneme-token").read_text() == token


def test_the_secrets_never_reach_the_image_or_git():
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert "docker/.env" in ignored and "docker/secrets" in ignored
    assert {".env", "secrets/"} <= set((DOCKER / ".gitignore").read_text().splitlines())


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (Debian: apt-get install -y prometheus)")
    return found


def test_promtool_checks_the_alert_rules_and_their_unit_tests():
    tool = promtool()
    for command in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]):
        done = subprocess.run([tool, *command], cwd=DOCKER / "prometheus", capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    alerts = {r["alert"] for g in yaml.safe_load((DOCKER / "prometheus" / "alerts.yml").read_text())["groups"]
              for r in g["rules"]}
    assert {"MnemeNoReadyWorker", "MnemeWorkerRestartsRising", "MnemeQueueGrowing"} <= alerts
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    mounts = compose()["services"]["prometheus"]["volumes"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts


def test_the_dashboard_is_parameterized_by_job_and_server():
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "mneme-replay.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"job", "instance"}
    assert "mneme_build_info" in variables["job"]["definition"]
    assert '$job' in variables["instance"]["definition"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, (panel["title"], expr)
            assert "mneme-replay-servers" not in expr and "gpu=" not in expr
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            assert "gpu" not in static.get("labels", {}), "a target label gpu collides with mneme_build_info{gpu}"
