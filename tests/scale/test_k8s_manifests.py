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


OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: not in the Kubernetes API schemas


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(str(path.relative_to(K8S)), doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def find(kind: str, name: str) -> dict:
    return next(doc for _, doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name)


def test_every_manifest_is_valid_for_the_kubernetes_api():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install 'mneme[test]')")
    docs = documents()
    assert {kind for _, kind in [(n, d["kind"]) for n, d in docs]} >= {
        "Namespace", "Deployment", "Service", "PersistentVolumeClaim", "Job", "NetworkPolicy"}
    for name, doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
    for kustomization_file in K8S.rglob("kustomization.yaml"):  # each folder's lists every manifest in it
        folder = kustomization_file.parent
        listed = [r for r in yaml.safe_load(kustomization_file.read_text()).get("resources", []) if r.endswith(".yaml")]
        assert sorted(listed) == sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")


def test_a_mistake_is_caught_by_the_validator():
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    broken = find("Deployment", "mneme-replay")
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = {"nvidia.com/gpu": 1}  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_replay_server_pods():
    deployment = find("Deployment", "mneme-replay")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # one server per GPU
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9400"
    assert container["readinessProbe"]["grpc"]["port"] == 50051
    args = build_parser().parse_args([a.replace("$(POD_IP)", "10.0.0.7") for a in container["args"][1:]])
    assert args.command == "serve" and args.metrics_port == 9400 and args.port == 50051
    assert args.announce == "s3://mneme/servers" and args.announce_address == "10.0.0.7:50051"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert args.token_file.startswith(mounts["token"]) and volumes["token"]["secret"]["secretName"] == "mneme-token"


def test_the_tuner_job():
    job = find("Job", "mneme-tune")
    container = job["spec"]["template"]["spec"]["containers"][0]
    script = container["args"][0]
    words = shlex.split(script.split("exec mneme ", 1)[1].replace("$RESUME", ""))
    args = build_parser().parse_args([w.replace("$JOB_COMPLETION_INDEX", "0") for w in words])
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("action", "command")}
    options = resolve_options(given)
    assert options.servers_from == "s3://mneme/servers" and options.connection.token_file == "/etc/mneme/token/token"
    assert options.optuna_storage == "grpc://mneme-study:13000" and job["spec"]["parallelism"] == 2
