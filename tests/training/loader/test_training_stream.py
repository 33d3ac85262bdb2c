"""Streaming input: the spec fit equals the in-memory fit, rank shards partition each epoch, bad input fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL
from ctr_features.compiled.records import numeric_matrix, string_column
from ctr_features.spec import FeatureSpec
from tests.training.reference_prepare import fit_chunks, prepare_streaming, transformed_in_memory
from training.data.cache import ensure_cache
from training.data.parquet import ParquetData
from training.data.sources import DataError
from training.loader.memory import load_in_memory
from training.loader.stream import StreamedBatches


def small_groups(data_copy: Path, rows_per_group: int = 500) -> Path:
    """The fixture's cache rewritten with small row groups (many pieces), as a plain Parquet input."""
    table = pq.read_table(ensure_cache(data_copy)[0])
    out = data_copy.parent / "small_groups.parquet"
    pq.write_table(table, out, row_group_size=rows_per_group)
    return out


def test_streaming_fit_equals_the_in_memory_fit_exactly(data_copy: Path) -> None:
    data = ParquetData.open([small_groups(data_copy, 333)], val_fraction=0.1)
    assert len(data.pieces) == 13
    train = pa.concat_tables(data.read(p, "train").table for p in data.pieces)
    cats = [string_column(train.column(f)) for f in CATEGORICAL_FIELDS]
    labels = train.column(LABEL).to_numpy().astype(np.float32)
    for kwargs in ({}, {"min_count": 20, "vocab_min_count": 2, "max_entries": 7}):
        in_memory = FeatureSpec.fit(numeric_matrix(train), cats, labels, **kwargs)  # type: ignore[arg-type]
        streamed = FeatureSpec.fit_streaming(fit_chunks(data), 128, **kwargs)  # type: ignore[arg-type]
        assert streamed.to_dict() == in_memory.to_dict()
        assert streamed.mean == in_memory.mean and streamed.std == in_memory.std


def epoch_indices(
    data: ParquetData, world: int, epoch: int, batch: int = 128, buffer: int = 700
) -> list[np.ndarray]:
    spec = FeatureSpec.fit_streaming(fit_chunks(data), 128)
    out = []
    for rank in range(world):
        ds = StreamedBatches(
            data, spec, "train", batch, seed=5, rank=rank, world_size=world, buffer_rows=buffer
        )
        ds.set_epoch(epoch)
        batches = list(ds)
        assert len(batches) == len(ds)  # every rank the same number of steps
        out.append(torch.cat([b[2] for b in batches]).numpy())
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_rank_shards_partition_each_epoch_and_replay_for_the_same_epoch(data_copy: Path, world: int) -> None:
    data = ParquetData.open([small_groups(data_copy)], val_fraction=0.1)
    n = data.rows("train")
    first = epoch_indices(data, world, epoch=0)
    assert np.array_equal(np.sort(np.concatenate(first)), np.arange(n))
    assert max(map(len, first)) - min(map(len, first)) <= 1
    again, other = epoch_indices(data, world, epoch=0), epoch_indices(data, world, epoch=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0][: len(first[0])])


def test_streamed_and_encoded_batches_hold_exactly_the_in_memory_rows(data_copy: Path) -> None:
    path = small_groups(data_copy)
    data, spec, encoded = prepare_streaming([path], 0.1, 128, None, print)
    memory = transformed_in_memory(data, spec)  # transformed straight from Parquet
    assert np.array_equal(load_in_memory(data, spec, encoded).train_x, memory.train_x)
    for source in (None, encoded["train"]):
        streamed = StreamedBatches(data, spec, "train", 256, seed=1, buffer_rows=1000, encoded=source)
        seen = 0
        for x, y, idx in streamed:
            assert torch.equal(x, torch.from_numpy(memory.train_x[idx.numpy()]))
            assert torch.equal(y.squeeze(1), torch.from_numpy(memory.train_y[idx.numpy()]))
            seen += len(idx)
        assert seen == len(memory.train_y)


def test_more_ranks_than_row_groups_split_the_row_group_fairly(data_copy: Path) -> None:
    data = ParquetData.open([small_groups(data_copy, 10_000)], val_fraction=0.1)
    assert len(data.pieces) == 1
    shards = epoch_indices(data, world=4, epoch=0)
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(data.rows("train")))
    n = data.rows("train")
    assert [len(s) for s in shards] == [
        (r + 1) * n // 4 - r * n // 4 for r in range(4)
    ]  # 908 or 909 rows each


def test_a_file_that_changes_while_read_is_an_error(data_copy: Path) -> None:
    path = small_groups(data_copy)
    data = ParquetData.open([path], val_fraction=0.1)
    data.read(data.pieces[0], "train")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(DataError, match=f"{path} changed while training was reading it"):
        data.read(data.pieces[1], "train")


def test_a_text_file_that_changes_while_parsed_leaves_no_cache(
    data_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.data.cache as cache_module

    real = cache_module.read_batches

    def growing(*args, **kwargs):  # type: ignore[no-untyped-def]
        for batch in real(*args, **kwargs):
            with data_copy.open("a") as f:
                f.write(data_copy.read_text().splitlines()[0] + "\n")
            yield batch

    monkeypatch.setattr(cache_module, "read_batches", growing)
    with pytest.raises(DataError, match=f"{data_copy} changed while it was being parsed"):
        ensure_cache(data_copy)
    assert not cache_module.cache_path(data_copy).exists()


def write_bad_parquet(directory: Path) -> Path:
    directory.mkdir()
    table = pa.table({"label": [0, 1], "I1": [1.0, 2.0], **{f"C{i}": [1, 2] for i in range(1, 27)}})
    pq.write_table(table, directory / "part-0.parquet")
    return directory


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d.mkdir() or d, "holds no data files"),
        (lambda d: write_bad_parquet(d), "part-0.parquet: no column 'I2'"),
        (lambda d: Path(str(d) + "/*.tsv"), "no data files match"),
    ],
    ids=["empty-directory", "wrong-schema-parquet", "glob-matches-nothing"],
)
def test_bad_input_is_one_error_line_exit_1_and_no_run_directory(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess], make, message: str
) -> None:  # type: ignore[no-untyped-def]
    data = make(tmp_path / "data")
    proc = run_module("training", "--data", data, "--out", tmp_path / "run")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_only_one_of_two_concurrent_processes_parses_and_fits(data_copy: Path) -> None:
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        import training.data.cache as cache, tests.training.reference_prepare as dataset
        from ctr_features.spec import FeatureSpec
        counts = {{"parse": 0, "fit": 0}}
        def counting(name, fn):
            def wrapped(*a, **k):
                counts[name] += 1
                time.sleep(1.0)  # keep the lock held while the other process arrives
                return fn(*a, **k)
            return wrapped
        cache._build = counting("parse", cache._build)
        FeatureSpec.fit_streaming = counting("fit", FeatureSpec.fit_streaming)
        while not Path({str(data_copy.parent / "go")!r}).exists():
            time.sleep(0.01)
        path, _ = cache.ensure_cache({str(data_copy)!r}, say=print)
        data, spec, _ = dataset.prepare_streaming([path], 0.1, 128, None, print)
        print("counts", counts["parse"], counts["fit"], data.rows("train"))
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    (data_copy.parent / "go").touch()
    outs = [p.communicate(timeout=240) for p in procs]
    counts = [
        next(line.split()[1:] for line in out.splitlines() if line.startswith("counts")) for out, _ in outs
    ]
    assert sum(int(c[0]) for c in counts) == 1 and sum(int(c[1]) for c in counts) == 1
    assert counts[0][2] == counts[1][2]
    assert any("waiting for another process" in out for out, _ in outs)


_PEAK_RSS = """
import sys
from pathlib import Path
from tests.training.reference_prepare import fit_chunks, transformed_in_memory
from ctr_features.spec import FeatureSpec
from training.data.parquet import ParquetData
from training.loader.stream import StreamedBatches
data = ParquetData.open([Path(sys.argv[1])], 0.1)
spec = FeatureSpec.fit_streaming(fit_chunks(data), 128)
if sys.argv[2] == "stream":
    rows = sum(len(b[2]) for b in StreamedBatches(data, spec, "train", 1024, buffer_rows=4096))
else:
    rows = len(transformed_in_memory(data, spec).train_y)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest) across exec.
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(rows, peak)  # kB
"""


@pytest.fixture(scope="module")
def sized_files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Synthetic data of 100k and 300k rows as Parquet with 8192-row groups."""
    from training.synth import generate

    out = {}
    for rows in (100_000, 300_000):
        src = tmp_path_factory.mktemp(f"rows{rows}") / "train.txt"
        generate(src, rows, seed=1)
        out[rows] = src.with_name("train.parquet")
        pq.write_table(pq.read_table(ensure_cache(src)[0]), out[rows], row_group_size=8192)
    return out


def peak_rss_mib(path: Path, loader: str) -> tuple[int, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(path), loader],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rows, kib = proc.stdout.split()
    return int(rows), int(kib) / 1024


@pytest.mark.slow  # make test-slow (docs/testing.md)
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak RSS from /proc")
def test_streaming_peak_memory_does_not_grow_with_the_row_count(sized_files: dict[int, Path]) -> None:
    # Each streaming peak is the lower of two runs: under a loaded machine (make test-slow's two workers)
    # one run's allocator once kept 76 MiB more freed memory mapped than the other's.
    (small_rows, small), (big_rows, big) = (
        min(peak_rss_mib(sized_files[n], "stream") for _ in range(2)) for n in (100_000, 300_000)
    )
    (_, small_mem), (_, big_mem) = (peak_rss_mib(sized_files[n], "memory") for n in (100_000, 300_000))
    assert big_rows > 2.9 * small_rows  # every training row was streamed
    # 200k more rows are ~100 MiB of float32 features: the in-memory path grows by that, streaming does not.
    assert big_mem - small_mem > 80, (small_mem, big_mem)
    assert big - small < 24, (small, big)


def test_a_lock_left_by_a_killed_builder_is_taken_over_at_once(tmp_path: Path) -> None:
    import socket
    import time

    from training.data.once import build_once

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    lock, result = tmp_path / "x.lock", tmp_path / "x"
    lock.write_text(f"{socket.gethostname()} {dead.stdout.strip()}\n")  # its holder was killed mid-build
    said: list[str] = []
    t0 = time.monotonic()
    assert build_once(lock, result.is_file, result.touch, said.append) is True
    assert time.monotonic() - t0 < 5 and result.is_file() and not lock.exists()
    assert said == [f"warning: taking over {lock} from a builder that stopped"]
