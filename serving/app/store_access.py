"""Before any port opens or worker starts: the credentials must be able to list every base path in a bucket.

Wrong or missing credentials do not heal by retrying, so they stop the start with one line and exit code 2
(as a bad flag does). A store that cannot be reached, or a bucket not made yet, may heal: the server starts,
serves what its cache holds, and its polls keep trying (serving/repository/bucket.py).
"""

from __future__ import annotations

import logging

from ctr_store.errors import DENIED, NO_CREDENTIALS, StoreError, classify
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import list_versions
from serving.app.config import ServerConfig
from serving.repository.model_config import read_model_config

log = logging.getLogger(__name__)
FATAL = (DENIED, NO_CREDENTIALS)


def check_store_access(cfg: ServerConfig) -> int:
    """One LIST per base path in a bucket; 2 (after one log line) when the credentials are refused, else 0."""
    if cfg.model_base_path is not None:
        paths = [cfg.model_base_path]
    else:
        assert cfg.model_config_file is not None
        paths = [spec.base_path for spec in read_model_config(cfg.model_config_file)]
    buckets = [p for p in paths if isinstance(p, BucketPath)]
    if not buckets:
        return 0
    try:
        store = ObjectStore()
        for base in buckets:
            list_versions(store, base)
    except StoreError as exc:
        if exc.reason not in FATAL:
            return 0  # logged by the model's first poll, which keeps retrying
        log.error("cannot start: the object store refuses the credentials (%s): %s", exc.reason, exc)
        return 2
    except Exception as exc:  # a client that cannot even be made, e.g. a malformed endpoint URL
        log.error("cannot start: %s", classify(exc, "the object store client"))
        return 2
    return 0
