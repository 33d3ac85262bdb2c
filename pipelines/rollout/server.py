"""What the controller asks a running server: its versions' load states and the fallbacks it counted.

`GET /v1/models/<model>` (TF Serving's model status: a version that failed to load is END with an error) and
`GET /monitoring/prometheus/metrics` (`ctr_serving_fallbacks_total{model_name,version,reason}`). A server
that does not answer gives None: the controller then decides nothing that needs the server.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

FALLBACKS = "ctr_serving_fallbacks_total"


@dataclass(frozen=True)
class LoadState:
    """One version as the status endpoint reports it."""

    state: str  # START, LOADING, AVAILABLE, UNLOADING, END
    error_code: str
    error_message: str

    @property
    def failed(self) -> bool:
        """The version ended with an error: it failed to load (or its files were refused)."""
        return self.state == "END" and (self.error_code not in ("OK", "", "0") or bool(self.error_message))


class ServerProbe:
    """Reads one server's REST API (base URL e.g. http://127.0.0.1:8501)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _get(self, path: str) -> bytes | None:
        request = urllib.request.Request(self.url + path)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            return bytes(exc.read())  # 503 still carries the status body (no version AVAILABLE)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def status(self, model: str) -> dict[int, LoadState] | None:
        """version -> its load state (None: the server did not answer with a status)."""
        body = self._get(f"/v1/models/{model}")
        try:
            entries = json.loads(body)["model_version_status"] if body is not None else None
        except (ValueError, KeyError, TypeError):
            return {} if body is not None and b"Could not find" in body else None
        if not isinstance(entries, list):
            return None
        found = {}
        for e in entries:
            try:
                status = e.get("status") or {}
                found[int(e["version"])] = LoadState(
                    str(e.get("state", "")),
                    str(status.get("error_code", "OK")),
                    str(status.get("error_message", "")),
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return found

    def fallbacks(self, model: str) -> dict[int, float] | None:
        """version -> fallbacks the server counted for it, all reasons (None: no metrics answered)."""
        body = self._get("/monitoring/prometheus/metrics")
        if body is None:
            return None
        counts: dict[int, float] = {}
        try:
            for family in text_string_to_metric_families(body.decode()):
                for sample in family.samples:
                    if sample.name != FALLBACKS or sample.labels.get("model_name") != model:
                        continue
                    try:
                        version = int(sample.labels.get("version", ""))
                    except ValueError:
                        continue
                    counts[version] = counts.get(version, 0.0) + float(sample.value)
        except (ValueError, UnicodeDecodeError):
            return None
        return counts
