"""bench/harness/profile.py: py-spy's collapsed stacks grouped by where the time goes, and the table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.harness.profile import category, group, table

ROOT = "<module> (serving/__main__.py:29);run_server (serving/app/server.py:366);Runner.run (asyncio/runners.py:118)"


def stack(*frames: str) -> list[str]:
    return [*ROOT.split(";"), *frames]


def test_innermost_frame_of_ours_takes_the_native_work_it_called() -> None:
    frames = stack(
        "HttpConnection._serve_pending (serving/http/connection.py:272)",
        "encode_predictions (serving/codecs/rest_codec.py:164)",
        "0x7fcd13a386dd (orjson/orjson.cpython-311-x86_64-linux-gnu.so)",
    )
    assert category(frames) == "serving/codecs/rest_codec"


def test_onnx_runtime_the_loop_the_kernel_and_waiting_have_their_own_lines() -> None:
    ort = stack(
        "OnnxRuntimeBackend.predict (serving/runtime/onnx_runtime.py:111)",
        "Session.run (onnxruntime/capi/onnxruntime_inference_collection.py:406)",
    )
    assert category(ort) == "ONNX Runtime"
    assert category(stack("uv__io_poll (linux.c:1546)", "uv__stream_io (stream.c:1210)")) == "event loop"
    write = stack("UVStream__try_write (loop.c:106818)", "write (libc.so.6)")
    assert category(write) == "kernel: socket write"
    assert category(stack("uv__io_poll (linux.c:1452)", "epoll_pwait (libc.so.6)")) is None


def test_group_counts_samples_and_table_scales_them_to_the_cpu_a_request(tmp_path: Path) -> None:
    collapsed = tmp_path / "stacks.txt"
    lines = [
        ";".join(stack("RestRouter.handle (serving/protocols/router.py:88)")) + " 3",
        ";".join(stack("uv__run_idle (loop-watcher.c:68)")) + " 1",
        ";".join(stack("uv__io_poll (linux.c:1452)", "epoll_pwait (libc.so.6)")) + " 6",
    ]
    collapsed.write_text("\n".join(lines) + "\n")
    counts = group(collapsed)
    assert counts == Counter({"serving/protocols/router": 3, "event loop": 1, "waiting": 6})
    assert table(counts, kernel_share=0.2, cpu_us=100.0).splitlines() == [
        "| where | share of server CPU | µs a request |",
        "|---|---|---|",
        "| kernel (sockets, scheduling; perf) | 20.0% | 20.0 |",
        "| serving/protocols/router | 60.0% | 60.0 |",
        "| event loop | 20.0% | 20.0 |",
        "| **all** (4 py-spy samples) | 100% | 100.0 |",
    ]
