"""deploy/k8s as shipped, variant by variant (what ``kubectl apply -k`` applies, rendered by kubectl's
kustomize where installed and by kustomize_lite everywhere): valid objects, no placeholders, a versioned
image, hardened pods, gRPC health probes without a token, the study server, the tuner resuming on restart."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from kustomize_lite import build, kubectl_kustomize

from mneme.cli import build_parser
from replay_server.server.serve import ServerOptions, exposure_error
from tuner.options import resolve_options

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs of the Prometheus Operator


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of deploy/k8s with its secrets made by make-secrets.sh, and a TLS overlay."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("secrets"))
    done = subprocess.run(["sh", str(root / "make-secrets.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (root / "tls").mkdir()
    (root / "tls" / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "mneme",
        "resources": ["../base"],
        "components": ["../components/replay-servers", "../components/tuner", "../components/tls"],
        "images": [{"name": "mneme-replay-server", "newTag": VERSION}]}))
    return root


def variants(tree: Path, name: str) -> list[list[dict]]:
    """The objects of one variant: kustomize_lite's, and kubectl's where it is installed."""
    root = tree if name == "." else tree / name
    rendered = [build(root)]
    real = kubectl_kustomize(root)
    if real is not None:
        rendered.append(real)
    return rendered


def find(docs: list[dict], kind: str, name: str) -> dict | None:
    return next((d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name), None)


def container(docs: list[dict], kind: str, name: str) -> dict:
    return find(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def test_make_secrets_is_private_and_keeps_what_exists(tree):
    folder = tree / "base" / "secrets"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    token = (folder / "token").read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    subprocess.run(["sh", str(tree / "make-secrets.sh")], check=True, capture_output=True, timeout=60)
    assert (folder / "token").read_text() == token


@pytest.mark.parametrize("name", [".", "tune", "monitored", "tls"])
def test_every_object_is_valid_and_hardened(tree, name):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install 'mneme[test]'")
    for docs in variants(tree, name):
        for doc in docs:
            if doc["kind"] in OPERATOR_KINDS:
                assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]
                continue
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
            assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "mneme"
        text = yaml.safe_dump_all(docs)
        assert "REPLACE" not in text and "change-me" not in text
        for doc in docs:
            if doc["kind"] not in ("Deployment", "Job"):
                continue
            pod = doc["spec"]["template"]["spec"]
            for c in pod["containers"]:
                if not c["image"].startswith("mneme-replay-server"):
                    continue  # MinIO's own images
                assert c["image"] == f"mneme-replay-server:{VERSION}", c["image"]
                assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
                context = c["securityContext"]
                assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
                assert context["capabilities"]["drop"] == ["ALL"]
                assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, "a writable /tmp"


def test_the_default_variant_starts_no_tuner(tree):
    for docs in variants(tree, "."):
        assert find(docs, "Job", "mneme-tune") is None and find(docs, "Deployment", "mneme-replay") is not None
        assert {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"} == {"mneme-token", "mneme-s3"}


def test_the_servers_need_the_token_and_answer_probes_without_it(tree):
    for docs in variants(tree, "."):
        server = container(docs, "Deployment", "mneme-replay")
        args = build_parser("serve").parse_args([a.replace("$(POD_IP)", "10.0.0.7") for a in server["args"][1:]])
        assert args.token_file.startswith("/etc/mneme/token/") and args.announce_address == "10.0.0.7:50051"
        assert exposure_error(ServerOptions(host=args.host, token_file=args.token_file)) is None
        for probe in ("readinessProbe", "livenessProbe"):
            assert server[probe]["grpc"] == {"port": args.port}, "the kubelet's gRPC probe (health needs no token)"
        pod = find(docs, "Deployment", "mneme-replay")["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(args.metrics_port)
        assert server["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_tls_probes_through_replay_server_probe(tree):
    for docs in variants(tree, "tls"):
        server = container(docs, "Deployment", "mneme-replay")
        args = build_parser("serve").parse_args([a.replace("$(POD_IP)", "10.0.0.7") for a in server["args"][1:]])
        assert args.tls_cert and args.tls_key
        probe = server["readinessProbe"]["exec"]["command"]
        assert probe[:3] == ["python3", "-m", "replay_server.probe"] and "--tls-ca" in probe
        tuner = tuner_words(container(docs, "Job", "mneme-tune"))
        assert "--tls-ca" in tuner and "--tls-server-name" in tuner


def tuner_words(c: dict) -> list[str]:
    script = c["args"][0]
    return shlex.split(script.split("exec mneme ", 1)[1].replace("$RESUME", ""))


def test_the_tuners_share_the_study_server(tree):
    for docs in variants(tree, "tune"):
        words = [w.replace("$JOB_COMPLETION_INDEX", "0") for w in tuner_words(container(docs, "Job", "mneme-tune"))]
        args = build_parser("tune").parse_args(words)
        given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("action", "command")}
        options = resolve_options(given)
        assert options.optuna_storage == "grpc://mneme-study:13000" and options.servers_from == "s3://mneme/servers"
        study = container(docs, "Deployment", "mneme-study")
        served = build_parser("study-server").parse_args(study["args"][1:])
        assert served.port == 13000 and served.insecure and served.url.startswith("journal:/study/")
        assert find(docs, "Service", "mneme-study")["spec"]["ports"][0]["port"] == 13000
        policy = find(docs, "NetworkPolicy", "mneme-study")
        tuner_labels = find(docs, "Job", "mneme-tune")["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= tuner_labels.items()
        env = {e["name"]: e for e in container(docs, "Job", "mneme-tune")["env"]}
        assert env["RECORD_DB"]["valueFrom"]["configMapKeyRef"]["name"] == "mneme-recording"


def test_a_restarted_tuner_pod_resumes(tree, tmp_path):
    script = container(build(tree / "tune"), "Job", "mneme-tune")["args"][0].replace("/results", str(tmp_path))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mneme").write_text('#!/bin/sh\necho "$@"\n')
    (bin_dir / "mneme").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "JOB_COMPLETION_INDEX": "1",
           "RECORD_DB": "s3://b/r.json", "RECORD_ID": "7", "STUDY": "s"}
    first = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30).stdout
    assert "--resume" not in first and f"--results-dir {tmp_path}/task-1" in first
    (tmp_path / "task-1").mkdir()
    (tmp_path / "task-1" / "config.json").write_text("{}")
    again = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30).stdout
    assert again.rstrip().endswith("--resume")


def test_monitoring_objects_and_alert_rules(tree, tmp_path):
    docs = build(tree / "monitored")
    monitor = find(docs, "ServiceMonitor", "mneme-replay")
    service = find(docs, "Service", "mneme-replay")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    rule = find(docs, "PrometheusRule", "mneme-replay")
    alerts = yaml.safe_load((ROOT / "docker" / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"], "the same alert rules as docker/prometheus/alerts.yml"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install -y prometheus)")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_overlay_pins_the_image_to_the_version():
    for path in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(path.read_text())
        for image in spec.get("images", []):
            assert image["newTag"] == VERSION, f"{path}: newTag {image['newTag']} is not mneme {VERSION}"
