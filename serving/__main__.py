"""`python -m serving`: parse flags, run the server until SIGTERM, exit 0."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

from serving.config import parse_config
from serving.server import serve


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("serving")
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # uvloop is not built for Windows; asyncio's loop works, only slower
        log.warning("uvloop not installed; using the default asyncio loop")
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(cfg))
    except OSError as exc:  # a port in use, or an address that is not ours
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
