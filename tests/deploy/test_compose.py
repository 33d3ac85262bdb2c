"""compose.yaml: it validates, and every service's command, file and dependency exists in the project."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from dockerfiles import exec_form, final_stage, healthcheck, single
from module_flags import accepted_flags, flag_value, flags, named_mounts, script_module_calls

from tests.helpers import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
ROLLOUT_OVERRIDE = yaml.safe_load((REPO_ROOT / "compose.rollout.yaml").read_text())["services"]
LONG_RUNNING = (
    "serving",
    "tfserving",
    "prometheus",
    "grafana",
    "live-eval",
    "rollout",
    "objectstore",
    "serving-s3",
    "traffic",
    "online",
)
ALL_PROFILES = [
    "--profile",
    "monitoring",
    "--profile",
    "tfserving",
    "--profile",
    "live",
    "--profile",
    "rollout",
    "--profile",
    "objectstore",
    "--profile",
    "online",
]


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
    rollout = ["-f", "compose.yaml", "-f", "compose.rollout.yaml"]
    for files, profile in (
        (["-f", "compose.yaml"], []),
        (["-f", "compose.yaml"], ALL_PROFILES),
        (rollout, ALL_PROFILES),
    ):
        proc = subprocess.run(
            [*cli, *files, *profile, "config", "--quiet"],
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
    assert SERVICES["live-eval"]["profiles"] == ["live", "online"]
    assert SERVICES["traffic"]["profiles"] == SERVICES["online"]["profiles"] == ["online"]
    assert SERVICES["rollout"]["profiles"] == SERVICES["model-config"]["profiles"] == ["rollout"]
    for name in ("objectstore", "model-s3", "serving-s3"):
        assert SERVICES[name]["profiles"] == ["objectstore"], name
    # `docker compose up serving` starts the model service and the server only.
    assert {name for name, service in SERVICES.items() if "profiles" not in service} == {"model", "serving"}
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
    assert sorted(built) == [
        "live-eval",
        "model",
        "model-config",
        "model-s3",
        "objectstore",
        "online",
        "rollout",
        "serving",
        "serving-s3",
        "traffic",
    ]
    for build in built.values():
        assert (REPO_ROOT / build["context"] / build["dockerfile"]).is_file()
    # Three images: each service builds the one its image names, as `model`, `serving` and `objectstore` do.
    images = {SERVICES[name]["image"]: built[name] for name in ("model", "serving", "objectstore")}
    for name, build in built.items():
        assert images[SERVICES[name]["image"]] == build, name


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


def test_live_eval_reads_the_servers_request_logs_and_the_clicks():
    live = SERVICES["live-eval"]
    assert live["entrypoint"] == ["python", "-m", "pipelines.live_eval"]
    assert set(flags(live["command"])) <= accepted_flags("pipelines.live_eval")
    assert SERVICES["model"]["image"] == live["image"]  # the trainer image: pyarrow, ctr_model, pipelines
    mounts = named_mounts(live)
    logs = flag_value(live["command"], "--logs")
    serving_logs = flag_value(SERVICES["serving"]["command"], "--request_log_dir")
    assert (
        mounts[logs] == ("request-logs", True)
        and named_mounts(SERVICES["serving"])[serving_logs][0] == "request-logs"
    )
    assert mounts[flag_value(live["command"], "--clicks")] == ("clicks", True)
    state = flag_value(live["command"], "--state-dir")
    [(volume, read_only)] = [m for t, m in mounts.items() if state.startswith(t + "/")]
    assert (volume, read_only) == ("live", False)
    assert (
        flag_value(live["command"], "--metrics-port") == "9108" and "9108" in live["healthcheck"]["test"][-1]
    )


def test_rollout_edits_the_config_file_the_overridden_server_reads():
    rollout = SERVICES["rollout"]
    assert rollout["entrypoint"] == ["python", "-m", "pipelines.rollout"]
    assert set(flags(rollout["command"])) <= accepted_flags("pipelines.rollout")
    assert rollout["image"] == SERVICES["serving"]["image"]  # the server's config parser is its own
    config = flag_value(rollout["command"], "--model-config")
    # The override runs the image's entrypoint with the config file in place of --model_name/--model_base_path.
    entrypoint = exec_form(
        single(final_stage(REPO_ROOT / "docker" / "Dockerfile.serving"), "ENTRYPOINT").args
    )
    served = ROLLOUT_OVERRIDE["serving"]["entrypoint"]
    assert [a for a in entrypoint if not a.startswith(("--model_name=", "--model_base_path="))] == served[:5]
    assert flag_value(served, "--model_config_file") == config
    assert float(flag_value(served, "--model_config_file_poll_wait_seconds")) > 0
    assert set(flags(served + SERVICES["serving"]["command"])) <= accepted_flags("serving")
    assert ROLLOUT_OVERRIDE["serving"]["depends_on"] == {
        "model-config": {"condition": "service_completed_successfully"}
    }
    assert set(ROLLOUT_OVERRIDE) == {"serving"}
    # Both see the config file in the models volume: the controller writes it, the server reads it.
    assert named_mounts(rollout)["/models"] == ("models", False)
    assert named_mounts(SERVICES["serving"])["/models"] == ("models", True)
    # The controller reads the figures live-eval writes.
    live_state = flag_value(SERVICES["live-eval"]["command"], "--state-dir")
    assert flag_value(rollout["command"], "--eval-state") == live_state
    assert named_mounts(rollout)["/live"] == ("live", True)
    state = flag_value(rollout["command"], "--state-dir")
    assert named_mounts(rollout)[state] == ("rollout-state", False)
    assert flag_value(rollout["command"], "--server") == "http://serving:8501"
    assert (
        flag_value(rollout["command"], "--metrics-port") == "9109"
        and "9109" in rollout["healthcheck"]["test"][-1]
    )


def test_model_config_service_writes_a_config_the_server_accepts(tmp_path):
    from serving.repository.model_config import read_model_config

    service = SERVICES["model-config"]
    mounts = named_mounts(service)
    [(source, target)] = [
        (v.split(":")[0], v.split(":")[1]) for v in service["volumes"] if v.startswith("./")
    ]
    [spec] = read_model_config(REPO_ROOT / source)
    assert (spec.name, str(spec.base_path)) == ("ctr", SERVICES["model"]["environment"]["MODEL_BASE_PATH"])
    assert mounts["/models"] == ("models", False)
    # The script, run on a folder standing in for /models: it writes the file once and never overwrites it.
    script = (
        service["entrypoint"][2].replace("/models/", f"{tmp_path}/").replace(target, str(REPO_ROOT / source))
    )
    assert service["entrypoint"][:2] == ["sh", "-c"]
    subprocess.run(["sh", "-c", script], check=True)
    written = tmp_path / "models.config"
    assert written.read_text() == (REPO_ROOT / source).read_text()
    written.write_text("# edited by the controller\n")
    subprocess.run(["sh", "-c", script], check=True)
    assert written.read_text() == "# edited by the controller\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models.config"]


@pytest.mark.parametrize("name", ["live-eval", "rollout"])
def test_live_services_run_hardened_and_write_only_their_volumes(name: str):
    service = SERVICES[name]
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    assert service["cap_drop"] == ["ALL"] and service["security_opt"] == ["no-new-privileges:true"]
    writable = {target for target, (_, read_only) in named_mounts(service).items() if not read_only}
    written = {flag_value(service["command"], "--state-dir")}
    if name == "rollout":
        written.add(flag_value(service["command"], "--model-config").rsplit("/", 1)[0])
    assert all(any(w == t or w.startswith(t + "/") for t in writable) for w in written), (writable, written)
    assert _duration_s(service["stop_grace_period"]) >= 10
