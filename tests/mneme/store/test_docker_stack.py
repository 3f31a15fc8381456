"""The docker/ stack is kept right without building images: compose file, Prometheus config, dashboard."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[3] / "docker"
#: The metric families the replay server exports (replay_server/server/metrics.py) that the dashboard must show.
SERVER_METRICS = {
    "mneme_replays_total",
    "mneme_replay_latency_seconds",
    "mneme_compile_cache_hits_total",
    "mneme_compile_cache_misses_total",
    "mneme_worker_restarts_total",
    "mneme_queue_depth",
    "mneme_in_flight",
    "mneme_workers_ready",
    "mneme_compile_seconds",
    "mneme_prepared_instance_bytes",
    "mneme_build_info",
}


def load_generator():
    spec = importlib.util.spec_from_file_location("generate_stack", DOCKER / "generate_stack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replay_servers(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items() if name.startswith("replay-server-gpu")}


def test_checked_in_files_are_the_generators_output():
    gen = load_generator()
    assert (DOCKER / "docker-compose.yml").read_text() == gen.render(gen.compose(gen.DEFAULT_GPUS), gen.DEFAULT_GPUS), (
        "docker/docker-compose.yml is stale: run python docker/generate_stack.py")
    assert (DOCKER / "prometheus" / "prometheus.yml").read_text() == gen.render(
        gen.prometheus(gen.DEFAULT_GPUS), gen.DEFAULT_GPUS), "prometheus.yml is stale: run docker/generate_stack.py"


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_one_server_per_gpu_each_with_its_own_device_reservation(gpus):
    gen = load_generator()
    compose = yaml.safe_load(gen.render(gen.compose(gpus), gpus))
    servers = replay_servers(compose)
    assert len(servers) == gpus
    reserved = []
    for name, server in servers.items():
        devices = server["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1 and devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        reserved += devices[0]["device_ids"]
        command = server["command"]
        assert command[:2] == ["mneme", "serve"]
        assert command[command.index("--store") + 1].startswith("s3://")
        assert server["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert server["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert sorted(reserved, key=int) == [str(i) for i in range(gpus)], "every GPU is reserved exactly once"
    host_ports = [p.rsplit(":", 1)[0] for s in servers.values() for p in s["ports"]]
    assert len(host_ports) == len(set(host_ports)), "host ports collide"


def test_compose_services_ports_and_volumes():
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"minio", "create-bucket", "prometheus", "grafana"} <= set(services)
    published = "${MNEME_PUBLISH_ADDRESS:-127.0.0.1}"
    assert f"{published}:9000:9000" in services["minio"]["ports"]
    assert f"{published}:3000:3000" in services["grafana"]["ports"]
    assert f"{published}:9090:9090" in services["prometheus"]["ports"]
    assert "mc mb --ignore-existing local/mneme" in services["create-bucket"]["entrypoint"][-1]
    command = replay_servers(compose)["replay-server-gpu0"]["command"]
    bucket = command[command.index("--store") + 1].split("/")[2]
    assert bucket == "mneme", "the servers read the bucket the stack creates"
    declared = set(compose["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is missing"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        build = service.get("build")
        if build:
            assert (DOCKER / build["context"] / build["dockerfile"]).is_file()


def test_prometheus_scrapes_every_replay_server():
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {t for sc in jobs["mneme-replay-servers"]["static_configs"] for t in sc["targets"]}
    expected = set()
    for name, server in replay_servers(compose).items():
        command = server["command"]
        expected.add(f"{name}:{command[command.index('--metrics-port') + 1]}")
    assert targets == expected


def test_promtool_accepts_the_prometheus_config():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install -y prometheus)")
    result = subprocess.run([promtool, "check", "config", str(DOCKER / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "mneme-replay.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def metric_families(expr: str) -> set[str]:
    names = set(re.findall(r"\bmneme_[a-z_]+", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_dashboard_is_valid_and_covers_the_required_views():
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "mneme-replay.json").read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Replay rate", "Outcomes", "Replay latency", "Compile-cache hit ratio", "Worker restarts", "Queue depth",
            "In flight", "Ready workers", "Compile time", "Prepared instance memory"} <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    datasources = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = datasources["datasources"][0]["uid"]
    assert all(p["datasource"]["uid"] == uid for p in dashboard["panels"])
    used = set().union(*(metric_families(e) for e in dashboard_exprs()))
    assert used == SERVER_METRICS, (
        f"dashboard uses {sorted(used - SERVER_METRICS)}, misses {sorted(SERVER_METRICS - used)}")
    for expr in dashboard_exprs():
        assert expr.count("(") == expr.count(")"), expr
    provider = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "dashboards" / "mneme.yml").read_text())
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    mounts = dict(v.split(":")[:2][::-1] for v in compose["services"]["grafana"]["volumes"])
    assert mounts[provider["providers"][0]["options"]["path"]] == "./grafana/dashboards"


def test_dashboard_metrics_are_what_the_replay_server_exports():
    metrics = pytest.importorskip("replay_server.server.metrics", reason="the replay server package is not importable")
    from prometheus_client import generate_latest

    server = metrics.ServerMetrics(gpu=0, engine="test")
    exposition = generate_latest(server.registry).decode()
    samples = [line for line in exposition.splitlines() if line and not line.startswith("#")]
    exported = {line.split("{")[0].split(" ")[0] for line in samples}
    exported = {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in exported}
    missing = SERVER_METRICS - exported
    assert not missing, f"the replay server no longer exports {sorted(missing)}; update the dashboard"
    assert 'outcome="verified"' in exposition, "the Outcomes panel groups by the 'outcome' label"
