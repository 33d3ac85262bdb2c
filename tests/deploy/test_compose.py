"""compose.yaml: it validates, and every service's command, file and dependency exists in the project."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from dockerfiles import exec_form, final_stage, healthcheck, single
from module_flags import accepted_flags, flags, script_module_calls

from tests.helpers import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
LONG_RUNNING = ("serving", "tfserving", "prometheus", "grafana")


def _duration_s(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert match, f"expected a duration like 30s, got {text!r}"
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2)]


def _compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or Debian's `docker-compose`; neither needs a running engine for config."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_file_validates_with_the_compose_cli():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("needs `docker compose` or `docker-compose` (Debian: apt-get install docker-compose)")
    for profile in ([], ["--profile", "monitoring", "--profile", "tfserving"]):
        proc = subprocess.run(
            [*cli, "-f", "compose.yaml", *profile, "config", "--quiet"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr


def test_serving_waits_for_the_one_shot_model_service():
    assert SERVICES["serving"]["depends_on"] == {"model": {"condition": "service_completed_successfully"}}
    assert SERVICES["model"]["restart"] == "no"
    assert "profiles" not in SERVICES["serving"] and "profiles" not in SERVICES["model"]
    # Both see the same repository: the model service writes it, serving reads it.
    assert "models:/models" in SERVICES["model"]["volumes"]
    assert "models:/models:ro" in SERVICES["serving"]["volumes"]
    assert SERVICES["model"]["environment"]["MODEL_BASE_PATH"] == "/models/ctr"


def test_optional_services_sit_in_their_profiles():
    assert SERVICES["prometheus"]["profiles"] == ["monitoring"]
    assert SERVICES["grafana"]["profiles"] == ["monitoring"]
    assert SERVICES["tfserving"]["profiles"] == ["tfserving"]
    assert "models:/models:ro" in SERVICES["tfserving"]["volumes"]
    assert SERVICES["tfserving"]["image"].startswith("tensorflow/serving:")
    assert SERVICES["tfserving"]["environment"] == {"MODEL_NAME": "ctr", "MODEL_BASE_PATH": "/models"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_health_restart_and_resource_limits(name: str):
    service = SERVICES[name]
    assert {"cpus", "memory"} <= set(service["deploy"]["resources"]["limits"])
    assert service["restart"] in ("no", "unless-stopped", "on-failure", "always")
    check = service["healthcheck"]
    if name in LONG_RUNNING:
        assert check["test"][0] == "CMD" and {"interval", "timeout", "retries"} <= set(check)
    else:  # the one-shot job: its exit status is what serving waits on
        assert check == {"disable": True}


def test_serving_healthcheck_is_the_images_and_stop_grace_outlasts_the_drain():
    _, image_check = healthcheck(final_stage(REPO_ROOT / "docker" / "Dockerfile.serving"))
    serving = SERVICES["serving"]
    assert serving["healthcheck"]["test"] == ["CMD", *image_check]
    drain = next(
        float(a.split("=")[1]) for a in serving["command"] if a.startswith("--grace_period_seconds=")
    )
    assert _duration_s(serving["stop_grace_period"]) > drain


def test_serving_runs_the_image_entrypoint_hardened():
    serving = SERVICES["serving"]
    assert "entrypoint" not in serving, "the image's entrypoint is what tests/deploy runs on the host"
    assert serving["read_only"] is True and serving["tmpfs"] == ["/tmp"]
    assert serving["cap_drop"] == ["ALL"] and serving["security_opt"] == ["no-new-privileges:true"]


def test_model_service_has_room_in_dev_shm_for_nccl():
    size = SERVICES["model"]["shm_size"]
    assert re.fullmatch(r"\d+gb", size) and int(size[:-2]) >= 1, (
        f"shm_size {size} (Docker's 64 MB hangs NCCL)"
    )


def test_built_services_name_dockerfiles_that_exist():
    built = {name: s["build"] for name, s in SERVICES.items() if "build" in s}
    assert sorted(built) == ["model", "serving"]
    for build in built.values():
        assert (REPO_ROOT / build["context"] / build["dockerfile"]).is_file()


def test_bind_mounted_files_exist():
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO_ROOT / source).exists(), f"{name} mounts {source}, which does not exist"


def test_serving_command_flags_are_server_flags():
    entrypoint = exec_form(
        single(final_stage(REPO_ROOT / "docker" / "Dockerfile.serving"), "ENTRYPOINT").args
    )
    used = flags(entrypoint + SERVICES["serving"]["command"])
    assert set(used) <= accepted_flags("serving")


def test_model_service_script_calls_modules_with_flags_they_accept():
    entrypoint = SERVICES["model"]["entrypoint"]
    assert entrypoint[0] == "sh"
    script = REPO_ROOT / entrypoint[1]
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
    calls = script_module_calls(script)
    assert [module for module, _ in calls] == ["training.synth", "training", "export"]
    train_args = SERVICES["model"]["environment"]["TRAIN_ARGS"].split()
    for module, args in calls:
        extra = train_args if module == "training" else []
        unknown = set(flags(args + extra)) - accepted_flags(module)
        assert not unknown, f"`python -m {module}` does not accept {sorted(unknown)}"


def _bootstrap(tmp_path, prepare) -> list[str]:  # type: ignore[no-untyped-def]
    """Run the `model` service's script with a PYTHON that records its calls; the modules it ran."""
    tmp_path.mkdir()
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\necho "$2" >> {tmp_path}/calls\n')
    stub.chmod(0o755)
    prepare(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(stub), "MODEL_BASE_PATH": str(tmp_path / "models/ctr")}
    env["WORK_DIR"] = str(tmp_path / "artifacts")
    proc = subprocess.run(
        ["sh", str(REPO_ROOT / "docker" / "bootstrap-model.sh")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    calls = tmp_path / "calls"
    return calls.read_text().split() if calls.exists() else []


def test_bootstrap_trains_once_and_resumes_an_interrupted_export(tmp_path):
    def empty(root):  # type: ignore[no-untyped-def]
        (root / "models" / "ctr").mkdir(parents=True)

    def trained(root):  # type: ignore[no-untyped-def]
        empty(root)
        for folder in ("data", "run"):
            (root / "artifacts" / folder).mkdir(parents=True)
        (root / "artifacts" / "data" / "train.txt").write_text("")
        (root / "artifacts" / "run" / "metrics.json").write_text("{}")  # training's last file
        (root / "models" / "ctr" / ".tmp-1-host-x-9").mkdir()  # a staging folder is not a version

    def published(root):  # type: ignore[no-untyped-def]
        (root / "models" / "ctr" / "1").mkdir(parents=True)

    assert _bootstrap(tmp_path / "a", empty) == ["training.synth", "training", "export"]
    assert _bootstrap(tmp_path / "b", trained) == ["export"]
    assert _bootstrap(tmp_path / "c", published) == []
