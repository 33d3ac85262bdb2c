"""Plain helpers every stage's tests share: the repository root and a free local port."""

from __future__ import annotations

import socket
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it; tests never use a fixed port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
