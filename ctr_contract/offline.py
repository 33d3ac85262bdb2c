"""Keep libraries from phoning home: switches that must be set before the library first loads.

onnxruntime (>= 1.29 on Linux) sends usage events to mobile.events.data.microsoft.com (a DNS lookup some
seconds after the first session) and writes a device id under $HOME/.cache/Microsoft. A server on a
read-only root filesystem in a cluster must do neither. `ORT_DISABLE_TELEMETRY=1` is ORT's full opt-out
(no uploader, no events, no device-id file), read once when its environment starts, so `serving` and
`export` set it when their package is imported, before any module imports onnxruntime.
"""

from __future__ import annotations

import os

OFFLINE_ENV = {"ORT_DISABLE_TELEMETRY": "1"}


def disable_telemetry() -> None:
    """Set every library's telemetry opt-out in this process's environment (and its children's)."""
    os.environ.update(OFFLINE_ENV)
