"""A container engine for `make test-containers`: the Docker API (podman's or Docker's), and a private podman.

`Engine` speaks the Docker HTTP API over a unix socket (or tcp://) with the standard library only, so the same
checks run against podman's `system service` or a Docker daemon. `PrivatePodman` starts `podman system service`
on a socket of its own, with a containers.conf of its own (ulimits the host allows, the cgroup manager and
runtime this host can use), and stops it at the end; it never touches an engine the user runs.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any


class EngineError(RuntimeError):
    """The engine answered an error; the message is the engine's."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Engine:
    """The Docker API at `host` (unix:///path or tcp://host:port, as DOCKER_HOST)."""

    def __init__(self, host: str):
        self.host = host
        parsed = urllib.parse.urlparse(host)
        if parsed.scheme not in ("unix", "tcp", "http"):
            raise SystemExit(f"test-containers: DOCKER_HOST={host}: only unix:// and tcp:// are supported")
        self._unix = parsed.path if parsed.scheme == "unix" else None
        self._netloc = parsed.netloc

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._unix:
            return _UnixConnection(self._unix, timeout)
        return http.client.HTTPConnection(self._netloc, timeout=timeout)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout: float = 60.0,
        raw: bytes | None = None,
    ) -> Any:
        """One API call; JSON in and out (a stream of JSON lines comes back as a list). Raises EngineError."""
        if params:
            path += "?" + urllib.parse.urlencode(params)
        connection = self._connection(timeout)
        headers = {"Content-Type": "application/json"}
        data = json.dumps(body).encode() if body is not None else raw
        if raw is not None:
            headers = {"Content-Type": "application/x-tar"}
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        except OSError as exc:
            raise EngineError(f"{method} {path}: {exc}") from exc
        finally:
            connection.close()
        text = payload.decode(errors="replace").strip()
        if response.status >= 400:
            try:
                message = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                message = text
            raise EngineError(f"{message} (HTTP {response.status})")
        if not text:
            return None
        try:
            parsed = json.loads(text)
            lines = [parsed] if isinstance(parsed, dict) else []
        except ValueError:  # a stream of JSON lines (pull, import, build)
            parsed = lines = [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
        errors = [line["error"] for line in lines if isinstance(line, dict) and line.get("error")]
        if errors:
            raise EngineError(str(errors[-1]))
        return parsed

    def ping(self) -> bool:
        try:
            connection = self._connection(5.0)
            connection.request("GET", "/_ping")
            ok = connection.getresponse().status == 200
            connection.close()
            return ok
        except OSError:
            return False

    def image(self, name: str) -> dict[str, Any] | None:
        """The image's inspect document, or None when the engine does not hold it."""
        try:
            return self.call("GET", f"/images/{urllib.parse.quote(name, safe='')}/json")
        except EngineError as exc:
            if "404" in str(exc):
                return None
            raise

    def pull(self, name: str, timeout: float = 120.0) -> None:
        repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
        self.call("POST", "/images/create", params={"fromImage": repo, "tag": tag}, timeout=timeout)

    def import_tar(self, tar: Path, repo: str, tag: str, changes: list[str]) -> None:
        params = {"fromSrc": "-", "repo": f"{repo}:{tag}"}  # Docker and podman both take the tag in repo
        query = urllib.parse.urlencode(params) + "".join("&changes=" + urllib.parse.quote(c) for c in changes)
        self.call("POST", f"/images/create?{query}", raw=tar.read_bytes(), timeout=600)

    def run(self, image: str, argv: list[str], timeout: float = 120.0, **config: Any) -> tuple[int, str]:
        """Create, start and wait for a container; (exit code, logs). Removed afterwards."""
        created = self.call("POST", "/containers/create", {"Image": image, "Cmd": argv, **config})
        cid = created["Id"]
        try:
            self.call("POST", f"/containers/{cid}/start")
            code = self.call("POST", f"/containers/{cid}/wait", timeout=timeout)["StatusCode"]
            connection = self._connection(30)
            connection.request("GET", f"/containers/{cid}/logs?stdout=1&stderr=1")
            logs = _demux(connection.getresponse().read())
            connection.close()
            return code, logs
        finally:
            with contextlib.suppress(EngineError):
                self.call("DELETE", f"/containers/{cid}", params={"force": "1"})

    def container(self, cid: str) -> dict[str, Any]:
        return self.call("GET", f"/containers/{cid}/json")

    def logs(self, cid: str) -> str:
        connection = self._connection(30)
        try:
            connection.request("GET", f"/containers/{cid}/logs?stdout=1&stderr=1")
            return _demux(connection.getresponse().read())
        finally:
            connection.close()

    def containers(self, project: str, service: str, stopped: bool = False) -> list[str]:
        """The ids of a compose service's containers (running ones unless `stopped`)."""
        labels = [f"com.docker.compose.project={project}", f"com.docker.compose.service={service}"]
        params = {"filters": json.dumps({"label": labels}), **({"all": "1"} if stopped else {})}
        return [c["Id"] for c in self.call("GET", "/containers/json", params=params) or []]


def prune_stale_images(engine: Engine, build_output: str) -> int:
    """Remove the untagged images (build layers) that this run's builds did not use and no kept image descends
    from: an earlier build's layers of a changed Dockerfile step or pyproject.toml. Tagged images, the layers
    the builds made or took from the cache, and their ancestors stay, so the next run is as cached as this one
    and the store does not grow with every dependency change. Returns how many were removed."""
    images = engine.call("GET", "/images/json", params={"all": "1"}) or []
    by_id = {i["Id"].removeprefix("sha256:"): i for i in images}
    used = set(re.findall(r"--> (?:Using cache )?([0-9a-f]{11,64})\b", build_output))
    keep = {
        image_id
        for image_id, image in by_id.items()
        if [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
        or any(image_id.startswith(u) for u in used)
    }
    frontier = list(keep)
    while frontier:
        parent = (by_id[frontier.pop()].get("ParentId") or "").removeprefix("sha256:")
        if parent in by_id and parent not in keep:
            keep.add(parent)
            frontier.append(parent)
    removed = 0
    # Children before parents: the newest first.
    for image_id in sorted(set(by_id) - keep, key=lambda i: by_id[i].get("Created", 0), reverse=True):
        with contextlib.suppress(EngineError):
            engine.call("DELETE", f"/images/{image_id}", timeout=120)
            removed += 1
    return removed


def _demux(stream: bytes) -> str:
    """Docker's multiplexed log stream (8-byte frame headers) as text; plain text passes through."""
    out, i = [], 0
    while i + 8 <= len(stream) and stream[i] in (0, 1, 2) and stream[i + 1 : i + 4] == b"\0\0\0":
        size = int.from_bytes(stream[i + 4 : i + 8], "big")
        out.append(stream[i + 8 : i + 8 + size])
        i += 8 + size
    out.append(stream[i:])
    return b"".join(out).decode(errors="replace")


def host_ulimits() -> dict[str, tuple[int, int]]:
    """nofile and nproc at or below what this host grants: podman's defaults (1048576, 4194304) are refused
    where the host's hard limits are lower, and an nproc over kernel.pid_max is refused here too."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    cap = min(v for v in (nproc[1], pid_max) if v != resource.RLIM_INFINITY)
    return {"nofile": (nofile[0], nofile[0]), "nproc": (min(nproc[0], cap), min(nproc[0], cap))}


class PrivatePodman:
    """`podman system service` on STATE/podman.sock with a containers.conf and storage.conf of its own: images,
    layers and volumes in STORE (kept, so layers stay cached between runs), networks, events and run state in
    STATE (removed). Nothing of another podman or Docker (their stores, networks, sockets) is used."""

    def __init__(self, state: Path, store: Path):
        self.state = state
        self.store = store
        self.socket = state / "podman.sock"
        self.conf = state / "containers.conf"
        self.storage_conf = state / "storage.conf"
        self.log = state / "podman-service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_conf(self) -> None:
        limits = host_ulimits()
        ulimits = ", ".join(f'"{k}={s}:{h}"' for k, (s, h) in limits.items())
        systemd = Path("/run/systemd/system").is_dir()
        # crun refuses cgroup "hybrid" hosts (v1 controllers plus a v2 mount); runc runs there.
        hybrid = (
            Path("/sys/fs/cgroup/unified").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
        )
        runtime = "runc" if hybrid and shutil.which("runc") else ""
        lines = [
            "[containers]",
            f"default_ulimits = [{ulimits}]",
            "[engine]",
            f'cgroup_manager = "{"systemd" if systemd else "cgroupfs"}"',
            'events_logger = "file"',
            f'events_logfile_path = "{self.state / "events.log"}"',
            f'tmp_dir = "{self.state / "libpod"}"',
            *([f'runtime = "{runtime}"'] if runtime else []),
            "[network]",
            f'network_config_dir = "{self.state / "networks"}"',
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        self.store.mkdir(parents=True, exist_ok=True)
        self.storage_conf.write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{self.store}"\nrunroot = "{self.state / "run"}"\n'
        )

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CONTAINERS_CONF": str(self.conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
        }

    def start(self) -> str:
        """Start the service; its DOCKER_HOST."""
        self._write_conf()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        host = f"unix://{self.socket}"
        engine = Engine(host)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"test-containers: `podman system service` exited {self.proc.returncode}:\n"
                    + self.log.read_text()[-2000:]
                )
            if self.socket.exists() and engine.ping():
                return host
            time.sleep(0.2)
        raise SystemExit(f"test-containers: podman's API did not answer on {self.socket} within 30 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def explain_start_failure(message: str, conf: Path | None) -> str:
    """What is missing, from the runtime's error when a first container does not start."""
    hints = []
    low = message.lower()
    if "rlimit" in low:
        where = f" (default_ulimits in {conf})" if conf else " (podman: default_ulimits in containers.conf)"
        hints.append(
            f"the host denies the rlimits the engine asks for: set nofile/nproc at or below the host's{where}"
        )
    if "user namespace" in low or "newuidmap" in low or "unshare" in low:
        hints.append(
            "no user namespaces: enable them (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)"
        )
    if "cgroup" in low:
        hints.append(
            'the runtime cannot use this host\'s cgroups: try runtime = "runc" or cgroup_manager = "cgroupfs"'
        )
    if "permission denied" in low and not hints:
        hints.append(
            "the engine may not create containers here (run as root, or a rootless setup with subuids)"
        )
    return "; ".join(hints) or "see the engine's message above"
