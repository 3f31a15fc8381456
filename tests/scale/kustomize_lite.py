"""What ``kustomize build`` does with deploy/k8s, for machines without kubectl: resources (files and
directories), components, ``images``, ``namespace``, ``secretGenerator`` (names without the hash suffix)
and JSON 6902 patches with a kind/name target. Enough to validate what each variant applies; where
kubectl (kustomize v4 or later) is installed, the tests render with it too."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import yaml


def build(root: Path) -> list[dict]:
    """The objects ``kubectl kustomize root`` would print (secrets' names without their hash suffix)."""
    return _kustomization(root)


def _kustomization(root: Path) -> list[dict]:
    spec = yaml.safe_load((root / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for entry in spec.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            docs += _kustomization(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in spec.get("components", []):
        component = (root / entry).resolve()
        component_spec = yaml.safe_load((component / "kustomization.yaml").read_text())
        assert component_spec["kind"] == "Component", component
        docs += _kustomization(component) if component_spec.get("resources") else []
        for patch in component_spec.get("patches", []):
            _patch(docs, patch)
    for patch in spec.get("patches", []) if spec.get("kind") != "Component" else []:
        _patch(docs, patch)
    for generator in spec.get("secretGenerator", []):
        data = {}
        for item in generator.get("files", []):
            key, _, name = item.partition("=")
            data[key] = (root / name).read_text()
        for env in generator.get("envs", []):
            for line in (root / env).read_text().splitlines():
                if "=" in line and not line.startswith("#"):
                    key, value = line.split("=", 1)
                    data[key] = value
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": generator["name"]},
                     "type": "Opaque", "stringData": data})
    if spec.get("namespace"):
        for doc in docs:
            if doc["kind"] != "Namespace":
                doc["metadata"]["namespace"] = spec["namespace"]
    for image in spec.get("images", []):
        for container in _containers(docs):
            name, _, _tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return docs


def _containers(docs: list[dict]) -> list[dict]:
    found = []
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            found += doc["spec"]["template"]["spec"]["containers"]
    return found


def _patch(docs: list[dict], patch: dict) -> None:
    target = patch["target"]
    operations = yaml.safe_load(patch["patch"])
    for doc in docs:
        if doc["kind"] == target.get("kind") and doc["metadata"]["name"] == target.get("name"):
            for op in operations:
                _apply(doc, op)


def _apply(doc: dict, op: dict) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent = doc
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    if op["op"] == "add":
        value = copy.deepcopy(op["value"])
        if isinstance(parent, list):
            parent.append(value) if last == "-" else parent.insert(int(last), value)
        else:
            parent[last] = value
    elif op["op"] == "replace":
        parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    else:
        raise ValueError(f"patch operation {op['op']} is not supported here")


def kubectl_kustomize(root: Path) -> list[dict] | None:
    """``kubectl kustomize root`` where kubectl with kustomize v4 or later is installed, else None."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"Kustomize Version: v(\d+)", version)
    if not found or int(found.group(1)) < 4:
        return None
    done = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    for doc in docs:  # compare by the names the manifests give
        if doc["kind"] == "Secret":
            doc["metadata"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", doc["metadata"]["name"])
    for container in _containers(docs):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                ref["name"] = re.sub(r"-[a-z0-9]{10}$", "", ref["name"])
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "secret" in volume:
                    volume["secret"]["secretName"] = re.sub(r"-[a-z0-9]{10}$", "", volume["secret"]["secretName"])
    return docs
