"""deploy/k8s: every manifest validates against the Kubernetes API schemas (kubernetes-validate, offline:
the package carries the schemas), and what the containers run parses with mneme's own flags."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from mneme.cli import build_parser
from tuner.options import resolve_options

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def find(kind: str, name: str) -> dict:
    return next(doc for _, doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name)


def test_every_manifest_is_valid_for_the_kubernetes_api():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install 'mneme[test]')")
    docs = documents()
    assert {kind for _, kind in [(n, d["kind"]) for n, d in docs]} >= {
        "Namespace", "Secret", "Deployment", "Service", "PersistentVolumeClaim", "Job"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S.glob("*.yaml")
                                                       if p.name != "kustomization.yaml")


def test_a_mistake_is_caught_by_the_validator():
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    broken = find("Deployment", "mneme-replay")
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {"nvidia.com/gpu": 1}  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def shell_command(container: dict, program: str) -> list[str]:
    """The words after ``exec PROGRAM`` in a container's ``sh -c`` script, variables as placeholders."""
    script = container["args"][0]
    words = shlex.split(script.split(f"exec {program} ", 1)[1].replace("$TLS", ""))
    return [w.replace("$POD_IP", "10.0.0.7").replace("$JOB_COMPLETION_INDEX", "0") for w in words]


def test_the_replay_server_pods():
    deployment = find("Deployment", "mneme-replay")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # one server per GPU
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9400"
    assert "replay_server.probe" in container["readinessProbe"]["exec"]["command"]
    args = build_parser().parse_args(shell_command(container, "mneme"))
    assert args.command == "serve" and args.metrics_port == 9400 and args.port == 50051
    assert args.announce == "s3://mneme/servers" and args.announce_address == "10.0.0.7:50051"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert args.token_file.startswith(mounts["token"]) and volumes["token"]["secret"]["secretName"] == "mneme-token"
    assert volumes["tls"]["secret"]["optional"] is True  # TLS only where the mneme-tls secret exists


def test_the_tuner_job():
    job = find("Job", "mneme-tune")
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(shell_command(container, "mneme"))
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("action", "command")}
    options = resolve_options(given)
    assert options.servers_from == "s3://mneme/servers" and options.connection.token_file == "/etc/mneme/token/token"
    assert options.optuna_storage.startswith("journal:/results/") and job["spec"]["parallelism"] == 2
