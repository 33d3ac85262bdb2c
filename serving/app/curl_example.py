"""The ready-to-paste curl predict command printed by `--print_curl_example` (e.g. at the end of `make run`)."""

from __future__ import annotations

import json
from pathlib import Path

from serving.app.config import ServerConfig
from serving.repository.warmup import warmup_batches
from serving.runtime.servable import LoadedVersion

# The first row of Criteo's Kaggle train.txt (label 0), as a client sends it to the `raw` signature: counts as
# JSON integers, categoricals as strings, and "" (or null, or no key) where the file has an empty cell.
CRITEO_ROW: dict[str, int | str] = {
    "I1": 1,
    "I2": 1,
    "I3": 5,
    "I4": 0,
    "I5": 1382,
    "I6": 4,
    "I7": 15,
    "I8": 2,
    "I9": 181,
    "I10": 1,
    "I11": 2,
    "I12": "",
    "I13": 2,
    "C1": "68fd1e64",
    "C2": "80e26c9b",
    "C3": "fb936136",
    "C4": "7b4723c4",
    "C5": "25c83c98",
    "C6": "7e0ccccf",
    "C7": "de7995b8",
    "C8": "1f89b562",
    "C9": "a73ee510",
    "C10": "a8cd5504",
    "C11": "b2cb9c98",
    "C12": "37c9c164",
    "C13": "2824a5f6",
    "C14": "1adce6ef",
    "C15": "8ba8b39a",
    "C16": "891b62e7",
    "C17": "e5ba7672",
    "C18": "f54016b9",
    "C19": "21ddcdc9",
    "C20": "b1252a9d",
    "C21": "07b5194c",
    "C22": "",
    "C23": "3a171ecb",
    "C24": "c5c50484",
    "C25": "e8b83407",
    "C26": "9727dd16",
}


def curl_example(cfg: ServerConfig, version_dir: Path, servable: LoadedVersion) -> str:
    """A curl command predicting one instance: a raw Criteo row when the version serves `raw`, else the first
    warm-up row of engineered features (or zeros)."""
    sig = servable.backend.signature
    row: object
    if sig.has_raw:
        row = CRITEO_ROW
    else:
        batches = warmup_batches(version_dir, sig.input_name)
        row = [round(float(v), 4) for v in batches[0][0]] if batches else [0.0] * sig.width
    host = "localhost" if cfg.host in ("0.0.0.0", "::") else cfg.host
    body = json.dumps({"instances": [row]}, separators=(",", ":"))
    return (
        f"\nServing {cfg.model_name} version {servable.version}. Try:\n\n"
        f"curl -s -X POST http://{host}:{cfg.rest_api_port}/v1/models/{cfg.model_name}:predict \\\n"
        f"  -H 'Content-Type: application/json' \\\n"
        f"  -d '{body}'\n"
    )
