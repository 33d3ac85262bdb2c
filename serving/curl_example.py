"""The ready-to-paste curl predict command printed by `--print_curl_example` (e.g. at the end of `make run`)."""

from __future__ import annotations

import json

from serving.config import ServerConfig
from serving.versions import LoadedVersion
from serving.warmup import warmup_batches


def curl_example(cfg: ServerConfig, lv: LoadedVersion) -> str:
    """A curl command predicting one instance: the first warm-up row when there is one, else zeros."""
    sig = lv.backend.signature
    version_dir = cfg.model_base_path / str(lv.version)
    batches = warmup_batches(version_dir, sig.input_name)
    row = [round(float(v), 4) for v in batches[0][0]] if batches else [0.0] * sig.n_features
    host = "localhost" if cfg.host in ("0.0.0.0", "::") else cfg.host
    body = json.dumps({"instances": [row]}, separators=(",", ":"))
    return (
        f"\nServing {cfg.model_name} version {lv.version}. Try:\n\n"
        f"curl -s -X POST http://{host}:{cfg.rest_api_port}/v1/models/{cfg.model_name}:predict \\\n"
        f"  -H 'Content-Type: application/json' \\\n"
        f"  -d '{body}'\n"
    )
