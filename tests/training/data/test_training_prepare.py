"""`python -m training.prepare` and the shared preparation: same results as the streaming fit, from any input."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import training.data.cache
from tests.training.reference_prepare import prepare_streaming
from training.data.cache import ensure_cache
from training.data.preparation import prepare_data

Run = Callable[..., subprocess.CompletedProcess]


def _prepared(cache_dir: Path) -> tuple[dict, bytes, bytes]:
    """(spec dict, train records, val records) that a preparation left in `cache_dir`."""
    [meta] = cache_dir.glob("*.prepared-*.json")
    stem = meta.name.removesuffix(".json")
    records = [(cache_dir / f"{stem}.{s}.bin").read_bytes() for s in ("train", "val")]
    return json.loads(meta.read_text())["spec"], *records


def test_prepare_equals_todays_streaming_fit_and_records_over_many_row_groups(
    data_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training.data.cache, "ROW_GROUP_ROWS", 300)  # 4000 rows -> 14 row groups
    new = prepare_data(data_copy, tmp_path / "new", 0.1, 128, None, False, lambda _: None)
    assert len(new.data.pieces) == 14
    old_cache = tmp_path / "old" / "train.txt.cache.parquet"
    old_cache.parent.mkdir()
    shutil.copy(ensure_cache(data_copy, cache_dir=tmp_path / "new")[0], old_cache)
    _, spec, encoded = prepare_streaming([old_cache], 0.1, 128, None, lambda _: None)
    assert new.spec.to_dict() == spec.to_dict()
    for split in ("train", "val"):
        assert new.encoded[split].read_bytes() == encoded[split].read_bytes()  # bit-identical records


@pytest.mark.parametrize("codec", ["gzip", "zstd", "bz2"])
def test_compressed_file_prepares_exactly_like_the_plain_file(
    data_copy: Path, tmp_path: Path, run_module: Run, codec: str
) -> None:
    suffix = {"gzip": ".gz", "zstd": ".zst", "bz2": ".bz2"}[codec]
    packed = tmp_path / "packed" / f"day_0{suffix}"
    packed.parent.mkdir()
    with pa.output_stream(str(packed), compression=codec) as f:
        f.write(data_copy.read_bytes())
    plain = run_module("training.prepare", "--data", data_copy, "--cache-dir", tmp_path / "a", check=True)
    comp = run_module("training.prepare", "--data", packed.parent, "--cache-dir", tmp_path / "b", check=True)
    assert "prepared read 4000 rows, no bad rows" in plain.stdout
    assert "prepared read 4000 rows, no bad rows" in comp.stdout
    assert _prepared(tmp_path / "a") == _prepared(tmp_path / "b")
    assert not list(packed.parent.glob("*.txt"))  # streamed: nothing was decompressed to disk


def test_gzip_without_its_suffix_is_read_by_its_magic_bytes(data_copy: Path, tmp_path: Path) -> None:
    disguised = tmp_path / "g" / "train.txt"
    disguised.parent.mkdir()
    disguised.write_bytes(gzip.compress(data_copy.read_bytes()))
    out = prepare_data(disguised, tmp_path / "c", 0.1, 128, None, False, lambda _: None)
    assert out.report.rows == 4000


@pytest.mark.parametrize("codec", ["gzip", "bz2"])
def test_truncated_compressed_file_names_file_and_row_and_leaves_no_cache(
    data_copy: Path, tmp_path: Path, run_module: Run, codec: str
) -> None:
    text = data_copy.read_bytes()
    packed = (gzip.compress if codec == "gzip" else bz2.compress)(text)
    cut = tmp_path / "d" / ("day_0.gz" if codec == "gzip" else "day_0.bz2")
    cut.parent.mkdir()
    cut.write_bytes(packed[: len(packed) // 2])
    step = zlib.decompressobj(wbits=31) if codec == "gzip" else bz2.BZ2Decompressor()
    whole_rows = step.decompress(packed[: len(packed) // 2]).count(b"\n")
    assert whole_rows < 4000
    cache = tmp_path / "cache"
    proc = run_module("training.prepare", "--data", cut, "--cache-dir", cache)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: {cut}: compressed data breaks off after row {whole_rows} (Truncated compressed stream); "
        "the file is truncated or corrupt: download or compress it again"
    ]
    assert sorted(p.name for p in cache.iterdir()) == []  # no cache, complete-looking or not


def test_cache_dir_default_is_beside_writable_data(data_copy: Path, run_module: Run) -> None:
    proc = run_module("training.prepare", "--data", data_copy, check=True)
    assert proc.stdout.splitlines()[0] == f"cache folder: {data_copy.parent}"
    assert (data_copy.parent / "train.txt.cache.parquet").is_file()


def _in_read_only(folder: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run argv in a mount namespace where `folder` is read-only (even to root)."""
    script = f'mount --bind "{folder}" "{folder}" && mount -o remount,ro,bind "{folder}" && exec "$@"'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _read_only_mount_works() -> str | None:
    """None when `unshare -rm` can bind-mount a folder read-only here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    with tempfile.TemporaryDirectory() as folder:
        probe = _in_read_only(Path(folder), ["true"], dict(os.environ))
    return (
        None if probe.returncode == 0 else f"unshare -rm cannot bind-mount read-only: {probe.stderr.strip()}"
    )


_NO_READ_ONLY = _read_only_mount_works()


@pytest.mark.slow  # make test-slow (docs/testing.md)
@pytest.mark.skipif(_NO_READ_ONLY is not None, reason=str(_NO_READ_ONLY))
def test_training_from_read_only_data_caches_in_the_user_cache_folder(
    data_copy: Path, tmp_path: Path
) -> None:
    from tests.training.train_runs import TINY_RUN

    before = sorted(p.name for p in data_copy.parent.iterdir())
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    argv = [
        sys.executable,
        "-m",
        "training",
        "--data",
        str(data_copy),
        "--out",
        str(tmp_path / "run"),
        *TINY_RUN,
    ]
    proc = _in_read_only(data_copy.parent, argv, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"cache folder: {tmp_path / 'xdg' / 'ctr-pipeline'}" in proc.stdout
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert sorted(p.name for p in data_copy.parent.iterdir()) == before  # nothing written beside the data


@pytest.mark.skipif(_NO_READ_ONLY is not None, reason=str(_NO_READ_ONLY))
def test_read_only_data_without_a_writable_cache_folder_names_the_flag(
    data_copy: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(data_copy.parent / "xdg")}  # inside the read-only folder
    proc = _in_read_only(
        data_copy.parent, [sys.executable, "-m", "training.prepare", "--data", str(data_copy)], env
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: the data folder {data_copy.parent} is read-only and the user cache folder "
        f"{data_copy.parent / 'xdg' / 'ctr-pipeline'} cannot be written; pass --cache-dir DIR with a writable folder"
    ]


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_two_gloo_ranks_prepare_exactly_what_one_process_prepares(data_copy: Path, tmp_path: Path) -> None:
    lines = data_copy.read_text().splitlines(keepends=True)
    days = tmp_path / "days"
    days.mkdir()
    for i in range(3):  # three files: each rank parses its own, and fits and encodes its own row groups
        (days / f"day_{i}").write_text("".join(lines[i * 1334 : (i + 1) * 1334]))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv = ["-m", "training.prepare", "--data", str(days)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    two = subprocess.run(
        [*torchrun, *argv, "--cache-dir", str(tmp_path / "two")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run(
        [sys.executable, *argv, "--cache-dir", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert "prepared read 4000 rows, no bad rows" in two.stdout and "with 2 rank(s)" in two.stdout
    assert "with 1 rank(s)" in one.stdout
    assert _prepared(tmp_path / "two") == _prepared(tmp_path / "one")


def _peak_rss_mib(data: Path, cache_dir: Path) -> float:
    """Peak RSS of `python -m training.prepare` on `data`, measured inside that process."""
    code = (
        "import resource, sys; from training.prepare import main; rc = main(sys.argv[1:]); "
        "print('peak_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
    )
    argv = [sys.executable, "-c", code, "--data", str(data), "--cache-dir", str(cache_dir)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True)
    return int(proc.stdout.split("peak_kib ")[1].split()[0]) / 1024


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_preparation_memory_does_not_grow_with_the_row_count(tmp_path: Path) -> None:
    from training.synth import generate

    small = tmp_path / "small" / "train.txt"
    generate(small, rows=300_000, seed=5)
    large = tmp_path / "large" / "train.txt"
    large.parent.mkdir()
    text = small.read_bytes()
    large.write_bytes(text * 4)  # 4x the rows, the same distinct values: only the row count differs
    peaks = {n: _peak_rss_mib(p, tmp_path / f"cache_{n}") for n, p in (("small", small), ("large", large))}
    # Holding the rows would add ~250 bytes each, 200 MiB for the 900k extra rows; streaming adds nothing.
    assert peaks["large"] < peaks["small"] + 40, peaks


def test_value_counts_are_exact_under_the_cap_and_keep_the_frequent_values_above_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import training.data.category_counts as cc

    monkeypatch.setattr(cc, "MAX_VALUES", 8)
    exact, capped = cc.FieldCounts(), cc.FieldCounts()
    rng = np.random.default_rng(0)
    chunks = [rng.choice([b"a", b"b", b"c", "é".encode()], size=50) for _ in range(3)]
    for chunk in chunks:  # 4 distinct values: under the cap
        exact.add(pa.array(chunk.tolist(), pa.binary()), np.ones(50))
    values, views, clicks = exact.counts(1)
    assert clicks.tolist() == views.tolist()  # every label was 1
    allv, alln = np.unique(np.concatenate(chunks), return_counts=True)
    assert values.tolist() == allv.tolist() and views.tolist() == alln.tolist() and exact.error == 0
    for k in range(3):  # 3 frequent values, then 20 singletons per chunk: 63 distinct values, cap 8
        chunk = [b"x"] * 30 + [b"y"] * 20 + [b"z"] * 10 + [f"s{k}-{i}".encode() for i in range(20)]
        capped.add(pa.array(chunk, pa.binary()), np.zeros(len(chunk)))
    values, views, _ = capped.counts(2)
    assert values.tolist() == [b"x", b"y", b"z"] and views.tolist() == [90, 60, 30]
    assert capped.error == 1  # only singletons were ever dropped


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_training_reuses_what_prepare_left(data_copy: Path, tmp_path: Path, run_module: Run) -> None:
    from tests.training.train_runs import TINY_RUN

    cache = tmp_path / "cache"
    first = run_module("training.prepare", "--data", data_copy, "--cache-dir", cache, check=True)
    assert [line.split(":")[0] for line in first.stdout.splitlines()[1:4]] == ["parse", "fit", "encode"]
    again = run_module("training.prepare", "--data", data_copy, "--cache-dir", cache, check=True)
    assert again.stdout.splitlines()[1] == f"already prepared in {cache}: reused"
    run = run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        tmp_path / "run",
        "--cache-dir",
        cache,
        *TINY_RUN,
        check=True,
    )
    assert f"cache folder: {cache}" in run.stdout
    assert not [line for line in run.stdout.splitlines() if line.startswith(("parse:", "fit:", "encode:"))]


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_torchrun_training_prepares_on_every_rank_then_trains_with_ddp(
    data_copy: Path, tmp_path: Path
) -> None:
    from tests.training.train_runs import TINY_RUN

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv = [
        "-m",
        "training",
        "--data",
        str(data_copy),
        "--out",
        str(tmp_path / "run"),
        *TINY_RUN,
        "--devices",
        "2",
        "--accelerator",
        "cpu",
        "--strategy",
        "ddp",
    ]
    proc = subprocess.run(
        [*torchrun, *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [
        line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith(("parse:", "encode:"))
    ] == [
        "parse",
        "encode",
    ]  # printed once (rank 0), after both ranks prepared together
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["train_rows"] + metrics["val_rows"] == 4000


def test_the_parse_line_counts_only_the_rows_this_run_parsed(data_copy: Path, tmp_path: Path) -> None:
    folder = tmp_path / "days"
    folder.mkdir()
    lines = data_copy.read_bytes().splitlines(keepends=True)
    (folder / "day_0.txt").write_bytes(b"".join(lines))
    said: list[str] = []
    prepare_data(folder, tmp_path / "cache", 0.1, 128, None, False, said.append)
    assert next(s for s in said if s.startswith("parse:")).startswith(f"parse: {len(lines)} rows in ")
    (folder / "day_1.txt").write_bytes(b"".join(lines[:500]))  # a new day beside a cached one
    said.clear()
    prepare_data(folder, tmp_path / "cache", 0.1, 128, None, False, said.append)
    assert next(s for s in said if s.startswith("parse:")).startswith("parse: 500 rows in ")
    said.clear()
    prepare_data(folder, tmp_path / "cache", 0.1, 128, None, False, said.append)
    assert not [s for s in said if s.startswith(("parse:", "fit:", "encode:"))]  # all cached: no work
