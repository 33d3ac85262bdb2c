"""Where the builds of `make test-containers` get their base image and packages.

- The base image: `python:3.11-slim-bookworm` where it can be pulled (or `PYTHON_IMAGE` from the environment);
  otherwise a stand-in made from Debian's packages (debootstrap bookworm: python3, venv, headers) that trusts
  the host's CA bundle, as a company base image does. It is kept in the engine and reused.
- torch: the torch wheel of the CPU variant on the host's disk (pip's find-links and file:// indexes), served
  from 127.0.0.1 for the build as the `TORCH_INDEX_URL` build argument; without one, the Dockerfile's default.
- Everything else: the index the host's pip uses (pip's own variables, passed as build arguments when they
  are not pip's default; file:// indexes cannot reach a build and are left out).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine import Engine, EngineError

UPSTREAM_IMAGE = "python:3.11-slim-bookworm"
STANDIN_REPO, STANDIN_TAG = "localhost/ctr-python-standin", "3.11-bookworm"
STANDIN_PACKAGES = ("python3", "python3-venv", "python3-dev", "python-is-python3", "ca-certificates")
TORCH_VERSION, TORCH_VARIANT = "2.13.0", "cpu"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctr-pipeline" / "containers"


def say(message: str) -> None:
    print(f"test-containers: {message}", flush=True)


def pip_config(key: str) -> str:
    """pip's setting (PIP_* environment first, then `pip config get`), '' when unset."""
    value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if value is not None:
        return value
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", f"global.{key}"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


def host_ca_bundle() -> Path:
    for candidate in (
        pip_config("cert"),
        os.environ.get("SSL_CERT_FILE", ""),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise SystemExit("test-containers: no CA bundle on this host (pip's cert, SSL_CERT_FILE, /etc/ssl/certs)")


def ensure_debs(packages: list[str], commands: list[str]) -> None:
    """apt-get install the Debian packages whose commands are missing (root only; otherwise say so)."""
    missing = [p for p, c in zip(packages, commands, strict=True) if not shutil.which(c)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemExit(
            f"test-containers: needs {', '.join(missing)} (Debian): run as root, or `sudo apt-get install -y {' '.join(missing)}`"
        )
    say(f"installing {', '.join(missing)} from Debian")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"test-containers: `{' '.join(argv)}` failed:\n{proc.stderr[-2000:]}")


def _debian_mirror() -> str:
    for source in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        text = source.read_text() if source.is_file() else ""
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and words[1].rstrip("/").endswith("/debian"):
                return words[1]
            if words[:1] == ["deb"] and "bookworm" in words and words[-1] == "main" and "/debian" in line:
                return next(w for w in words if w.startswith("http"))
    return "http://deb.debian.org/debian"


def base_image(engine: Engine) -> tuple[str, str]:
    """(the PYTHON_IMAGE build argument, how it was had)."""
    wanted = os.environ.get("PYTHON_IMAGE")
    if wanted:
        if engine.image(wanted) is None:
            try:
                engine.pull(wanted)
            except EngineError as exc:
                raise SystemExit(f"test-containers: PYTHON_IMAGE={wanted} cannot be pulled: {exc}") from None
        return wanted, "PYTHON_IMAGE from the environment"
    if engine.image(UPSTREAM_IMAGE) is not None:
        return UPSTREAM_IMAGE, "already in the engine"
    try:
        engine.pull(UPSTREAM_IMAGE, timeout=180)
        return UPSTREAM_IMAGE, "pulled"
    except EngineError as exc:
        say(f"{UPSTREAM_IMAGE} cannot be pulled ({short_reason(exc)}): a stand-in from Debian")
    ca = host_ca_bundle()
    ca_hash = hashlib.sha256(ca.read_bytes()).hexdigest()[:16]
    name = f"{STANDIN_REPO}:{STANDIN_TAG}"
    found = engine.image(name)
    if found and (found.get("Config", {}).get("Labels") or {}).get("ctr.ca-sha256") == ca_hash:
        return name, "stand-in, already in the engine"
    ensure_debs(["debootstrap"], ["debootstrap"])
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
        rootfs, tar = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        mirror = _debian_mirror()
        say(f"debootstrap bookworm from {mirror} ({', '.join(STANDIN_PACKAGES)})")
        proc = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(STANDIN_PACKAGES)}",
                "bookworm",
                str(rootfs),
                mirror,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(
                f"test-containers: debootstrap failed (set PYTHON_IMAGE to a python:3.11 image you can reach):\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}"
            )
        for junk in (
            "var/cache/apt/archives",
            "var/lib/apt/lists",
            "usr/share/doc",
            "usr/share/man",
            "usr/share/locale",
        ):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
            (rootfs / junk).mkdir(parents=True, exist_ok=True)
        (rootfs / "etc/apt/sources.list").write_text(f"deb {mirror} bookworm main\n")
        # The host's trust store, as a company base image carries the company's CA.
        shutil.copyfile(ca, rootfs / "etc/ssl/certs/ca-certificates.crt")
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        changes = [
            f"ENV PIP_CERT={bundle}",
            f"ENV SSL_CERT_FILE={bundle}",
            f"ENV REQUESTS_CA_BUNDLE={bundle}",
            "ENV LANG=C.UTF-8",
            f"LABEL ctr.ca-sha256={ca_hash}",
            'CMD ["python3"]',
        ]
        engine.import_tar(tar, STANDIN_REPO, STANDIN_TAG, changes)
    return name, "stand-in built (debootstrap)"


def short_reason(exc: Exception) -> str:
    """An engine's pull error in a few words: `registry-1.docker.io: no such host`, or its last 120 characters."""
    text = str(exc).splitlines()[-1]
    found = re.search(r"lookup (\S+) on \S+: (.+)$", text)
    return f"{found.group(1)}: {found.group(2)}" if found else text[-120:]


def find_torch_wheel() -> Path | None:
    """The CPU torch wheel for this Python on the host's disk: pip's find-links and file:// indexes."""
    places = pip_config("find-links").split() + [
        u.removeprefix("file://") + "/torch"
        for u in pip_config("extra-index-url").split()
        if u.startswith("file://")
    ]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for place in places:
        folder = Path(place.removeprefix("file://"))
        if folder.is_dir():
            for wheel in sorted(
                folder.glob(f"torch-{TORCH_VERSION}+{TORCH_VARIANT}-{tag}-{tag}-*linux*_x86_64.whl")
            ):
                return wheel
    return None


class WheelServer:
    """A simple-index (PEP 503) of one wheel on 127.0.0.1: `<url>/torch/` lists it. The port is kept between
    runs, so that the TORCH_INDEX_URL build argument, and the layers after it, stay cached."""

    def __init__(self, wheel: Path, state: Path):
        project = state / "torch-index" / "torch"
        project.mkdir(parents=True)
        (project / wheel.name).symlink_to(wheel)
        handler = functools.partial(_QuietHandler, directory=str(state / "torch-index"))
        port_file = CACHE / "wheel-server-port"
        port = int(port_file.read_text()) if port_file.is_file() else 0
        try:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        except OSError:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        CACHE.mkdir(parents=True, exist_ok=True)
        port_file.write_text(str(self.server.server_port))
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_args(python_image: str, torch_index_url: str | None) -> dict[str, str]:
    """The build arguments of both images: the base, torch's index, and pip's own variables when set."""
    args = {"PYTHON_IMAGE": python_image}
    if torch_index_url:
        args["TORCH_INDEX_URL"] = torch_index_url
    index = pip_config("index-url")
    if index and not index.startswith("file:"):
        args["PIP_INDEX_URL"] = index
    extra = " ".join(u for u in pip_config("extra-index-url").split() if not u.startswith("file:"))
    if extra:
        args["PIP_EXTRA_INDEX_URL"] = extra
    trusted = pip_config("trusted-host")
    if trusted:
        args["PIP_TRUSTED_HOST"] = trusted
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate, timeout: float, interval: float = 0.5) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
