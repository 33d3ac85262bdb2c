"""docs/design.md's walk of a raw REST predict is the code's: every module of ours it passes through, in order.

One raw row is sent over a real socket to the server's own objects (the model built by serving/app/server.py's
`model_builder`, behind the REST router and one HTTP connection) on this event loop; a profile hook records the
module of each Python function called while the second such request is answered (the first one warms up). A
change of the walk fails here until docs/design.md says it.
"""

from __future__ import annotations

import asyncio
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from serving.app.config import parse_config
from serving.app.server import http_limits, model_builder
from serving.dataplane.model_set import ServedModels
from serving.http.connection import HttpConnection
from serving.http.shared import ConnectionBudget
from serving.observability.metrics import ServingMetrics
from serving.protocols.rest_body import BodyDecoder
from serving.protocols.router import RestRouter
from serving.repository.model_config import ModelSpec
from tests.helpers import REPO_ROOT
from tests.serving.raw_model_repo import fit_spec, write_raw_version

OURS = ("serving", "ctr_features", "ctr_contract")
WALK_HEADING = "## A raw REST predict, module by module"
MAX_MODULES = 15  # issue 45's bar: TF Serving's REST predict crosses about 6 files, KServe's about 3
BODY = b'{"instances": [{"I1": 3, "C1": "68fd1e64"}]}'


def documented_walk(text: str) -> list[str]:
    """The module column of the walk's table in docs/design.md, in order."""
    section = text.split(WALK_HEADING, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| \d+ \| `([^`]+)` \|", section, re.MULTILINE)


async def _walk(base: Path) -> tuple[list[str], bytes]:
    cfg = parse_config(["--model_name=ctr", f"--model_base_path={base}", "--enable_batching"])
    metrics = ServingMetrics()
    with ThreadPoolExecutor(1) as inference, ThreadPoolExecutor(1) as disk:
        build = model_builder(cfg, metrics, inference, disk)
        spec = ModelSpec(cfg.model_name, base, cfg.model_version_policy, cfg.version_labels)
        predictor = build(spec, lambda manager: (None, None))  # defaults: no drift window, no request log
        await predictor.manager.poll_once()
        app = RestRouter(ServedModels.one(predictor), BodyDecoder(cfg.max_instances), metrics.render)
        budget = ConnectionBudget(http_limits(cfg), metrics, b"")
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: HttpConnection(app, budget), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        request = b"POST /v1/models/ctr:predict HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
            len(BODY),
            BODY,
        )

        async def answer() -> bytes:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head)
            assert length is not None, head
            return head.split(b"\r\n", 1)[0] + b" " + await reader.readexactly(int(length.group(1)))

        await answer()  # warm-up: lazy imports and first-call caches are not the walk
        seen: dict[str, None] = {}

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            module = frame.f_globals.get("__name__", "")
            if event == "call" and module.split(".", 1)[0] in OURS:
                seen.setdefault(module)

        sys.setprofile(profile)
        try:
            answered = await answer()
        finally:
            sys.setprofile(None)
        writer.close()
        server.close()
        for servable in predictor.manager.loaded.values():
            servable.close()
    return [m.replace(".", "/") + ".py" for m in seen], answered


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    base = tmp_path_factory.mktemp("repo") / "ctr"
    write_raw_version(base, 1, fit_spec())
    modules, answered = asyncio.run(_walk(base))
    assert answered.startswith(b'HTTP/1.1 200 OK {"predictions":[['), answered
    return modules


def test_the_walk_in_docs_design_is_the_one_a_raw_rest_predict_takes(walk: list[str]) -> None:
    assert documented_walk((REPO_ROOT / "docs" / "design.md").read_text()) == walk


def test_a_raw_rest_predict_crosses_at_most_15_of_our_modules(walk: list[str]) -> None:
    assert len(walk) <= MAX_MODULES, walk


def test_the_walk_parser_reads_the_module_column_in_order() -> None:
    text = f"x\n{WALK_HEADING}\n\n| step | module | what |\n|---|---|---|\n| 1 | `a/b.py` | in |\n| 2 | `c.py` | on |\n\n## next\n| 3 | `d.py` | no |\n"
    assert documented_walk(text) == ["a/b.py", "c.py"]
