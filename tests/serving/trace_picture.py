"""The span tree of one traced request, drawn from the spans a real OTLP receiver got (docs/serving.md).

    .venv/bin/python -m tests.serving.trace_picture --capture BASE_PATH /tmp/spans.json
    .venv/bin/python -m tests.serving.trace_picture /tmp/spans.json docs/images/trace-raw-request.png

`--capture` starts a server on BASE_PATH (`--enable_batching`, every request traced) with the test receiver
(tests/serving/otlp_receiver.py), sends 30 raw rows one at a time and keeps the last one's spans; the tests
can write theirs too (CTR_TRACE_DUMP=FILE, test_serving_tracing.py). Prints the tree as text as well.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def ordered(spans: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(depth, span) depth-first from the root, children by start time."""
    ids = {s["span_id"] for s in spans}
    kids: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        kids.setdefault(s["parent_span_id"], []).append(s)
    roots = [s for s in spans if s["parent_span_id"] not in ids]
    out: list[tuple[int, dict[str, Any]]] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        out.append((depth, span))
        for child in sorted(kids.get(span["span_id"], []), key=lambda c: c["start_ns"]):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda r: r["start_ns"]):
        walk(root, 0)
    return out


def text_tree(spans: list[dict[str, Any]]) -> str:
    rows = ordered(spans)
    t0 = rows[0][1]["start_ns"]
    lines = []
    for depth, s in rows:
        attrs = {k: v for k, v in s["attributes"].items() if k.startswith("ctr.") and k != "ctr.entrypoint"}
        extra = f"  links: {len(s['links'])}" if s["links"] else ""
        lines.append(
            f"{'  ' * depth}{s['name']:<{14 - 2 * depth}} +{(s['start_ns'] - t0) / 1e3:7.0f} us "
            f"{(s['end_ns'] - s['start_ns']) / 1e3:7.0f} us  {attrs if attrs else ''}{extra}".rstrip()
        )
    return "\n".join(lines)


def draw(spans: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ordered(spans)
    t0 = rows[0][1]["start_ns"]
    total_us = (rows[0][1]["end_ns"] - t0) / 1e3
    colors = ["#3b6ea5", "#e08a2e", "#5aa469", "#b04a5a"]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    for i, (depth, s) in enumerate(rows):
        start, width = (s["start_ns"] - t0) / 1e3, max((s["end_ns"] - s["start_ns"]) / 1e3, total_us / 400)
        ax.barh(i, width, left=start, color=colors[depth % len(colors)], height=0.6)
        label = f"{'   ' * depth}{s['name']}  {(s['end_ns'] - s['start_ns']) / 1e3:.0f} us"
        if s["links"]:
            label += f"  (links: {len(s['links'])})"
        ax.text(-0.55, i, label, ha="left", va="center", fontsize=9, family="monospace", transform=blend(ax))
    root = rows[0][1]["attributes"]
    ax.set_title(
        f"one raw REST request: model {root.get('ctr.model.name')} v{root.get('ctr.model.version')}, "
        f"signature {root.get('ctr.signature')}, {root.get('ctr.batch_size')} row, {root.get('ctr.status')}\n"
        "(the spans an OTLP receiver got from the server, --enable_batching)",
        fontsize=9,
    )
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlim(0, total_us * 1.02)
    ax.set_xlabel("microseconds from the request span's start")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.36, right=0.97, top=0.86)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def blend(ax: Any) -> Any:
    """x in axes fractions, y in data rows."""
    from matplotlib.transforms import blended_transform_factory

    return blended_transform_factory(ax.transAxes, ax.transData)


def capture(base: Path, out: Path) -> None:
    import urllib.request

    from serving.app.curl_example import CRITEO_ROW
    from tests.serving.otlp_receiver import OtlpReceiver
    from tests.serving.server_process import ServerProcess

    receiver = OtlpReceiver()
    config = out.with_suffix(".tracing.json")
    config.write_text(
        json.dumps({"endpoint": receiver.endpoint, "sample_ratio": 1.0, "schedule_delay_ms": 50})
    )
    server = ServerProcess(base, out.with_suffix(".log"), "--enable_batching", f"--tracing_config={config}")
    try:
        server.wait_ready()
        body = json.dumps({"instances": [CRITEO_ROW]}).encode()
        for i in range(1, 31):  # the first ones warm the server up; the last one is drawn
            request = urllib.request.Request(server.url("/v1/models/ctr:predict"), data=body, method="POST")
            request.add_header("traceparent", f"00-{i:032x}-00f067aa0ba902b7-01")
            urllib.request.urlopen(request, timeout=10).read()
        spans = receiver.wait(lambda: (t := receiver.trace(f"{30:032x}")) and len(t) >= 7 and t)
        receiver.dump(spans, out)
    finally:
        server.stop()
        receiver.stop()


def main() -> None:
    if sys.argv[1] == "--capture":
        capture(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    spans = json.loads(Path(sys.argv[1]).read_text())
    print(text_tree(spans))
    if len(sys.argv) > 2:
        draw(spans, Path(sys.argv[2]))


if __name__ == "__main__":
    main()
