"""Reloads and memory: publish versions into a served repository as an operator does, wait on the model status,
and read the resident memory of the server's whole process tree (issue 44).

Used by tests/serving/repository/test_serving_reload_memory.py and `make soak` (tests/serving/soak_churn.py).
`python -m tests.serving.reload_memory VERSION_DIR` redoes the issue's table: one server on that version, ten
versions published one after another, the tree's RSS after each (docs/perf/serving-memory.md); `--code DIR` runs
the server of another checkout (the tree before a change) with this venv.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.helpers import REPO_ROOT
from tests.serving.server_process import ServerProcess, http

STATE_TIMEOUT_S = 60.0
MIB = 1 << 20


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (the workers of `--num_workers`, the body decoder's child), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # it exited meanwhile
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def rss(pid: int) -> int:
    """VmRSS of one process, in bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(pid: int) -> int:
    """The RSS of `pid` and every process below it, summed."""
    return sum(rss(p) for p in process_tree(pid))


def settled_rss(pid: int, timeout_s: float = 15.0, tolerance: int = MIB) -> int:
    """The tree's RSS once three reads 0.2 s apart agree within `tolerance` (or the last read at `timeout_s`)."""
    deadline, reads = time.monotonic() + timeout_s, [tree_rss(pid)]
    while time.monotonic() < deadline:
        time.sleep(0.2)
        reads = [*reads[-2:], tree_rss(pid)]
        if len(reads) == 3 and max(reads) - min(reads) <= tolerance:
            break
    return reads[-1]


def publish(source: Path, base: Path, version: int) -> Path:
    """Publish the version folder `source` as `base/<version>` the operator's way: copied into a temporary
    folder beside the versions (a name that is no version), then renamed into place in one step."""
    stage = base / f".incoming-{version}"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(source, stage)
    final = base / str(version)
    stage.rename(final)
    return final


def states(server: ServerProcess) -> dict[int, tuple[str, str]]:
    """version -> (state, error message) as the model status endpoint shows them now ({} when it does not)."""
    status, body = http(server.url(f"/v1/models/{server.model_name}"), timeout=5)
    if status != 200 or not isinstance(body, dict):
        return {}
    return {
        int(v["version"]): (v["state"], v.get("status", {}).get("error_message", ""))
        for v in body.get("model_version_status", [])
    }


def wait_states(server: ServerProcess, want: dict[int, str], timeout_s: float = STATE_TIMEOUT_S) -> float:
    """Poll the model status until each version of `want` is in its state ("AVAILABLE", "END"); returns the
    seconds it took. A version wanted AVAILABLE that ended with an error fails at once."""
    started = time.monotonic()
    seen: dict[int, tuple[str, str]] = {}
    while time.monotonic() < started + timeout_s:
        seen = states(server)
        if all(seen.get(v, ("", ""))[0] == state for v, state in want.items()):
            return time.monotonic() - started
        failed = [
            f"{v}: {seen[v][1]}"
            for v, s in want.items()
            if s == "AVAILABLE" and seen.get(v, ("",))[0] == "END"
        ]
        if failed or server.proc.poll() is not None:
            raise RuntimeError(
                f"wanted {want}; failed {failed}; exit {server.proc.poll()}\n{server.log()[-3000:]}"
            )
        time.sleep(0.02)
    raise TimeoutError(
        f"wanted {want}, the status shows {seen} after {timeout_s:g}s:\n{server.log()[-3000:]}"
    )


def wait_log(server: ServerProcess, pattern: str, count: int = 1, timeout_s: float = 30.0) -> list[str]:
    """Wait until the server's log holds `count` lines matching `pattern`; returns them."""
    regex, deadline = re.compile(pattern), time.monotonic() + timeout_s
    while True:
        found = [line for line in server.log().splitlines() if regex.search(line)]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise TimeoutError(f"{len(found)} of {count} log lines /{pattern}/:\n{server.log()[-3000:]}")
        time.sleep(0.05)


def reclaimed(server: ServerProcess, version: int, workers: int = 1) -> list[str]:
    """Wait for each worker's `<model> version N reclaimed: ...` line (serving/repository/reclaim.py)."""
    return wait_log(server, rf"\b{server.model_name} version {version} reclaimed:", count=workers)


def leaks(server: ServerProcess) -> list[str]:
    """The server's log lines that name an unloaded version still referenced."""
    return [line for line in server.log().splitlines() if "is still referenced" in line]


def labelled_versions(server: ServerProcess) -> set[int]:
    """The versions the metrics page has series of (a `version` label: fallbacks, shadow scores, statistics)."""
    _, text = http(server.url("/monitoring/prometheus/metrics"))
    return {int(v) for v in re.findall(r'[{,]version="(\d+)"', str(text))}


def reload(server: ServerProcess, source: Path, base: Path, version: int) -> float:
    """Publish `version` and wait until it is AVAILABLE and `version - 1` END; returns the seconds it took."""
    started = time.monotonic()
    publish(source, base, version)
    wait_states(server, {version: "AVAILABLE", version - 1: "END"})
    return time.monotonic() - started


# --- a realistic version: what `python -m export` publishes, with vocabularies of some size ----------------------


def realistic_run(run: Path, rows: int = 40_000, seed: int = 0) -> Path:
    """A training run dir (tests/export/export_runs.py) whose feature spec is fitted on `rows` synthetic rows of
    the built-in world, with every value seen twice in the vocabulary: 26 fields of thousands of values each, so
    a version holds megabytes of tables as `make run`'s does (a tiny spec would hide a leak of whole versions)."""
    from ctr_features.spec import FeatureSpec
    from tests.export.export_runs import make_run
    from training.synth import sample_rows

    make_run(run, seed=seed)
    rng = np.random.default_rng(seed)
    numeric, ranks = sample_rows(rng, rows)
    categorical = np.char.mod("%08x", np.maximum(ranks, 0)).astype(object)
    categorical[ranks < 0] = ""
    labels = (rng.random(rows) < 0.25).astype(np.float32)
    spec = FeatureSpec.fit(numeric, categorical, labels, min_count=50, vocab_min_count=2)
    spec.save(run / "feature_spec.json")
    val = slice(0, 2_000)
    np.savez(run / "val_raw.npz", numeric=numeric[val], categorical=categorical[val].astype(str))
    np.save(run / "train_features_sample.npy", spec.transform(numeric[:10_000], categorical[:10_000]))
    return run


def export_version(root: Path, rows: int = 40_000) -> Path:
    """Export `realistic_run` with `python -m export` (calibrated `ctr` and `raw_score`, the raw signature, the
    spec, the drift reference, warm-up, the SavedModel); returns the published version folder."""
    run, repo = realistic_run(root / "run", rows), root / "models" / "ctr"
    subprocess.run(
        [sys.executable, "-m", "export", "--run", str(run), "--repo", str(repo), "--no-torchscript"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return repo / "1"


def arena_figures(version_dir: Path, rounds: int = 3000, loads: int = 20) -> list[str]:
    """ONNX Runtime's CPU arena on and off, in this process, on one version: the median latency of a model call
    (features of 1 and of 256 rows, the raw graph on 1 row), the two sessions called in turn so that both see
    the same machine; then RSS after `loads` sessions loaded, run and released one after the other (malloc_trim
    after each)."""
    import gc

    from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
    from serving.observability.process import release_freed_memory
    from serving.runtime.onnx_runtime import OnnxRuntimeBackend

    model = version_dir / "model.onnx"
    backends = {arena: OnnxRuntimeBackend(model, 1, arena) for arena in (True, False)}
    raw = {f: np.array([3.0]) for f in NUMERIC_FIELDS} | {
        f: np.array(["68fd1e64"], object) for f in CATEGORICAL_FIELDS
    }
    calls = {
        "1 row": lambda b: b.predict(np.full((1, 128), 0.25, np.float32)),
        "256 rows": lambda b: b.predict(np.full((256, 128), 0.25, np.float32)),
        "raw graph, 1 row": lambda b: b.predict_raw(raw),
    }
    lines = []
    for name, call in calls.items():
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(rounds):
            for arena in (True, False) if i % 2 else (False, True):
                started = time.perf_counter()
                call(backends[arena])
                times[arena].append(time.perf_counter() - started)
        on, off = (float(np.median(times[a])) * 1e6 for a in (True, False))
        lines.append(f"{name}: median {on:.1f} us with the arena, {off:.1f} us without ({off - on:+.1f} us)")
    big = np.full((8192, 128), 0.25, np.float32)
    for arena in (True, False):  # what one burst leaves resident while the session lives on
        gc.collect()
        release_freed_memory()
        before = rss(os.getpid())
        backends[arena].predict(big)
        release_freed_memory()
        lines.append(
            f"arena {'on' if arena else 'off'}: one 8192-row call leaves {(rss(os.getpid()) - before) / MIB:+.1f} MiB"
        )
    del backends
    for arena in (True, False):
        gc.collect()
        release_freed_memory()
        before = rss(os.getpid())
        for _ in range(loads):
            backend = OnnxRuntimeBackend(model, 1, arena)
            for call in calls.values():
                for _ in range(20):
                    call(backend)
            del backend
            release_freed_memory()
        after = rss(os.getpid())
        lines.append(
            f"arena {'on' if arena else 'off'}: RSS {before / MIB:.0f} -> {after / MIB:.0f} MiB after {loads} sessions"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", type=Path, help="a published version folder (e.g. artifacts/models/ctr/1)")
    parser.add_argument("--versions", type=int, default=10, help="versions published after version 2")
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="the checkout whose server runs")
    parser.add_argument("--arena", action="store_true", help="measure ONNX Runtime's CPU arena instead")
    argv = sys.argv[1:] if argv is None else argv
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []  # more server flags, after --
    args = parser.parse_args(argv[: len(argv) - len(flags) - (1 if flags else 0)])
    if args.arena:
        print("\n".join(arena_figures(args.version)))
        return 0
    with tempfile.TemporaryDirectory(prefix="reload-memory-") as tmp:
        base = Path(tmp) / "ctr"
        base.mkdir()
        publish(args.version, base, 1)
        server = ServerProcess(base, Path(tmp) / "server.log", *flags, cwd=args.code)
        try:
            server.wait_ready(120)
            print(f"server {args.code} {' '.join(flags)}", flush=True)
            reclaims = (args.code / "serving/repository/reclaim.py").is_file()  # else a tree before them
            for version in range(2, args.versions + 3):
                took = reload(server, args.version, base, version)
                if reclaims:
                    reclaimed(server, version - 1)
                mib = settled_rss(server.proc.pid) / MIB
                print(f"version {version}: RSS {mib:.0f} MiB (reload {took:.1f} s)", flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
