"""A server under test that listens but fails every predict is reported after a short grace, not the whole timeout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness import procs, servers

FAILING_SERVER = """
import http.server, sys
class Failing(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"error": "Invoking custom service failed"}'
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Failing).serve_forever()
"""


def test_a_server_answering_only_errors_is_reported_with_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(servers, "ERROR_GRACE_S", 1.0)
    port = servers.free_port()
    log = tmp_path / "failing.log"
    proc = procs.start([sys.executable, "-c", FAILING_SERVER, str(port)], log=log)
    try:
        with pytest.raises(
            RuntimeError, match=r"answers HTTP 503: b'\{\"error\": \"Invoking custom service failed"
        ):
            servers.wait_until_serving(
                f"http://127.0.0.1:{port}{servers.PREDICT_PATH}", b"{}", proc, log, timeout_s=120
            )
    finally:
        procs.stop(proc)
