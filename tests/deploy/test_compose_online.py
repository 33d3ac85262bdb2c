"""compose.yaml's online profile: the services it starts, what each reads and writes, and the settings by variable.

The loop itself runs on an engine in `make test-containers` (tests/deploy/containers/online.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfiles import final_stage
from host_container import compose_default
from module_flags import accepted_flags, flag_value, flags, named_mounts

from tests.helpers import REPO_ROOT

SERVICES: dict[str, Any] = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"]
SETTINGS = {
    "CTR_ONLINE_INTERVAL_S": "20",
    "CTR_ONLINE_WINDOW_S": "4",
    "CTR_ONLINE_ENGINE": "flink",
    "CTR_ONLINE_TRAIN_ARGS": "--batch-size 256",
    "CTR_TRAFFIC_RATE": "7",
    "CTR_TRAFFIC_INSTANCES": "3",
    "CTR_TRAFFIC_DRIFT_SCALE": "12",
    "CTR_LIVE_MIN_ROWS": "100",
    "CTR_REQUEST_LOG_SAMPLE_RATE": "1",
}


def _config(env: dict[str, str]) -> dict[str, Any]:
    """`compose --profile online config`, the variables of `env` set (and no other CTR_ one)."""
    cli = ["docker", "compose"] if shutil.which("docker") else []
    if not cli or subprocess.run([*cli, "version"], capture_output=True, timeout=30).returncode != 0:
        cli = ["docker-compose"] if shutil.which("docker-compose") else []
    if not cli:
        pytest.skip("needs `docker compose` or `docker-compose` (Debian: apt-get install docker-compose)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CTR_")}
    proc = subprocess.run(
        [*cli, "-f", "compose.yaml", "--profile", "online", "config"],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    """The online profile's config with every setting of SETTINGS."""
    return _config(SETTINGS)


def _volume_at(service: dict[str, Any], path: str) -> tuple[str, bool]:
    """(volume, read-only) of the mount holding `path`."""
    mounts = named_mounts(service)
    [target] = sorted((t for t in mounts if path == t or path.startswith(t + "/")), key=len)[-1:]
    return mounts[target]


def _simulator(service: dict[str, Any]) -> str:
    """The module the traffic's entrypoint script execs."""
    [module] = re.findall(r"exec python -m ([\w.]+) \"\$\$@\"", service["entrypoint"][2])
    return module


def test_the_online_profile_starts_the_loop_and_live_evaluation(rendered):
    started = {
        name
        for name, service in rendered["services"].items()
        if "profiles" not in service or "online" in service["profiles"]
    }
    assert started == {"model", "serving", "traffic", "online", "live-eval"}
    assert {"request-logs", "clicks", "models", "online", "traffic", "live"} <= set(rendered["volumes"])


def test_settings_come_from_the_environment(rendered):
    expected = {
        ("online", "--interval-s"): ("300", "20"),
        ("online", "--window-s"): ("60", "4"),
        ("online", "--engine"): ("embedded", "flink"),
        ("online", "--train-args"): ("--batch-size 512", "--batch-size 256"),
        ("traffic", "--rate"): ("40", "7"),
        ("traffic", "--instances"): ("100", "3"),
        ("traffic", "--drift-scale"): ("24", "12"),
        ("live-eval", "--attribution-window-s"): ("60", "4"),  # the trainer's window
        ("live-eval", "--min-rows"): ("500", "100"),
        ("serving", "--request_log_sample_rate"): ("0.01", "1"),
    }
    for (service, flag), values in expected.items():
        command = SERVICES[service]["command"]
        found = (
            compose_default(flag_value(command, flag)),
            flag_value(rendered["services"][service]["command"], flag),
        )
        assert found == values, (service, flag)


def test_each_service_reads_what_the_one_before_it_writes():
    serving, traffic, online, live = (SERVICES[s] for s in ("serving", "traffic", "online", "live-eval"))
    assert online["entrypoint"] == ["python", "-m", "pipelines.online"]
    assert set(flags(online["command"])) <= accepted_flags("pipelines.online")
    assert set(flags(traffic["command"])) <= accepted_flags(_simulator(traffic))
    assert online["image"] == traffic["image"] == SERVICES["model"]["image"]  # the trainer image
    # The server's request logs and the traffic's clicks, read-only, by the trainer and by live-eval.
    logs = _volume_at(serving, flag_value(serving["command"], "--request_log_dir"))
    clicks = _volume_at(traffic, flag_value(traffic["command"], "--clicks-dir"))
    assert logs == ("request-logs", False) and clicks == ("clicks", False)
    for reader in (online, live):
        assert _volume_at(reader, flag_value(reader["command"], "--logs")) == ("request-logs", True)
        assert _volume_at(reader, flag_value(reader["command"], "--clicks")) == ("clicks", True)
    # The trainer publishes into the repository the server polls, warm-starting from the bootstrap's version 1.
    repo = flag_value(online["command"], "--repo")
    assert repo == SERVICES["model"]["environment"]["MODEL_BASE_PATH"]
    assert _volume_at(online, repo) == ("models", False) and named_mounts(serving)["/models"] == (
        "models",
        True,
    )
    assert _volume_at(online, flag_value(online["command"], "--work")) == ("online", False)
    assert _volume_at(traffic, flag_value(traffic["command"], "--summary")) == ("traffic", False)
    assert online["depends_on"] == {"model": {"condition": "service_completed_successfully"}}
    assert flag_value(traffic["command"], "--url") == "http://serving:8501"
    assert traffic["depends_on"] == {"serving": {"condition": "service_started"}}


def test_traffic_waits_for_the_model_then_runs_the_simulator_with_its_flags(tmp_path: Path):
    traffic = SERVICES["traffic"]
    assert traffic["entrypoint"][:2] == ["sh", "-c"]
    assert "http://serving:8501/v1/models/ctr" in traffic["entrypoint"][2]
    stub = tmp_path / "python"  # the model-status probe succeeds; the simulator's argv is recorded
    stub.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit 0\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    stub.chmod(0o755)
    script = traffic["entrypoint"][2].replace("$$", "$")  # compose's escape of `$`
    proc = subprocess.run(
        ["sh", "-c", script, *traffic["entrypoint"][3:], *traffic["command"]],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "argv").read_text().splitlines() == ["-m", _simulator(traffic), *traffic["command"]]


@pytest.mark.parametrize("name", ["traffic", "online"])
def test_online_services_run_hardened_on_the_trainer_images_mount_points(name: str):
    service = SERVICES[name]
    assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
    assert service["cap_drop"] == ["ALL"] and service["security_opt"] == ["no-new-privileges:true"]
    # Named volumes mounted where the image made a folder of its user, so that they are the user's.
    runs = " ".join(
        i.args for i in final_stage(REPO_ROOT / "docker" / "Dockerfile.trainer") if i.keyword == "RUN"
    )
    [chown] = re.findall(r"chown 10001:10001 ([^&]+)", runs)
    for target, (_, read_only) in named_mounts(service).items():
        assert read_only or target in chown.split(), f"{name} writes {target}, not made for uid 10001"
    assert service["stop_grace_period"] in ("15s", "30s")


def test_the_trainers_metrics_port_is_scraped_and_health_checked():
    online = SERVICES["online"]
    port = flag_value(online["command"], "--metrics-port")
    assert port in online["healthcheck"]["test"][-1] and online["ports"][0].endswith(f":{port}")
    prometheus = yaml.safe_load((REPO_ROOT / "docker/prometheus/prometheus.yml").read_text())
    [job] = [j for j in prometheus["scrape_configs"] if j["job_name"] == "online"]
    assert job["static_configs"][0]["targets"] == [f"online:{port}"]
