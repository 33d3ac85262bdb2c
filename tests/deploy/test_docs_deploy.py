"""The deploy page (docs/deploy.md): it covers compose, stock TF Serving, Kubernetes and multi-node training,
and the paths and flags it shows exist."""

from __future__ import annotations

import re
import shlex

from module_flags import accepted_flags, flags, module_calls

from tests.helpers import REPO_ROOT

SECTION = (REPO_ROOT / "docs" / "deploy.md").read_text()


def test_deploy_section_covers_each_way_to_run():
    headings = re.findall(r"^## (.+)$", SECTION, re.M)
    assert headings == [
        "Docker Compose (one host)",
        "The stock TensorFlow Serving on the same repository",
        "Kubernetes (kustomize)",
        "Models and data in a bucket",
        "Multi-node training",
    ]
    for command in (
        "docker compose up serving",
        "docker compose --profile monitoring up -d",
        "docker compose --profile tfserving up tfserving",
        "kubectl apply -k k8s/overlays/dev",
        "kubectl apply -k k8s/overlays/prod",
        "docker compose --profile objectstore up serving-s3",
        "kubectl apply -k k8s/overlays/s3",
        "ctr_serving_repository_errors_total",
        "--shm-size=",
    ):
        assert command in SECTION


def test_paths_the_section_names_exist():
    for path in set(re.findall(r"(?:docker|k8s)/[\w./-]+\w", SECTION)):
        assert (REPO_ROOT / path).exists() or (REPO_ROOT / "k8s/base" / path).exists(), (
            f"docs/deploy.md names missing {path}"
        )


def test_torchrun_example_uses_flags_the_trainer_accepts():
    block = re.search(r"```bash\n(torchrun .+?)\n# ", SECTION, re.S)
    assert block, "no torchrun example"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    [(module, args)] = module_calls(argv)
    assert module == "training"
    assert set(flags(args)) <= accepted_flags("training")
    assert set(flags(argv[1 : argv.index("-m")])) <= accepted_flags("torch.distributed.run")
