"""`python -m serving`: parse flags, run the server until SIGTERM, exit 0."""

from __future__ import annotations

import logging
import sys

from serving.app.config import parse_config
from serving.app.server import run_server
from serving.app.store_access import check_store_access


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    # With several workers every line names its process, as the parent's and workers' logs interleave.
    process = " [%(process)d]" if cfg.num_workers > 1 else ""
    logging.basicConfig(
        level=cfg.log_level.upper(), format=f"%(asctime)s %(levelname)s{process} %(name)s: %(message)s"
    )
    if cfg.log_level != "debug":  # botocore says where it found credentials, per client: noise at info
        logging.getLogger("botocore").setLevel(logging.WARNING)
    code = check_store_access(cfg)  # a base path in a bucket with refused credentials: exit 2
    if code:
        sys.exit(code)
    if cfg.num_workers > 1:
        from serving.app.workers import run_workers

        sys.exit(run_workers(cfg))
    code = run_server(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
