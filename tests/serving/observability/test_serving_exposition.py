"""The metrics text as parsers read it: odd model names and labels round-trip, restarts keep the folder small.

Model names come from `--model_config_file` (serving/repository/model_config.py allows any non-empty name
without '/'), so quotes, backslashes, newlines and any unicode reach the label values; prometheus_client's
own text parser and `promtool check metrics` must read them back exactly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from ctr_contract.repository import DRIFT_REFERENCE_PATH
from export.publish.drift_reference import build_reference
from serving.observability.drift import FLUSH_S
from serving.observability.metrics import ServingMetrics
from serving.observability.metrics_shared import (
    DEAD_TOTALS,
    SharedServingMetrics,
    directory_lock,
    fold_totals,
)
from tests.helpers import REPO_ROOT
from tests.serving.app.test_serving_workers import children, predict_until_served_by
from tests.serving.model_repo import WIDTH, write_manifest
from tests.serving.observability.test_serving_prometheus import TF_SERVING_LINT
from tests.serving.server_process import ServerProcess, http

ODD_NAMES = (
    'say "hi"',
    "back\\slash",
    "two\nlines",
    "a\\n literal, not a newline",
    "trailing backslash\\",
    '\\"both\\"',
    "ünïcødé ✓ 模型 🚀",
    "{braces},commas=equals",
    "tab\there",
    "carriage\rreturn",
    ":tensorflow:serving:request_count # HELP",
    " spaces around ",
)
ODD_LABELS = ('st"able', "can\\ary", "new\nline", "ütf ✓")
ROW = np.full((1, 128), 0.5, np.float32)
RESTARTS = 6
Labels = frozenset[tuple[str, str]]


def config_text(base: Path) -> str:
    """ModelServerConfig text with "ctr" and every odd name on `base`, each with the odd version labels."""
    config = model_server_config_pb2.ModelServerConfig()
    for name in ("ctr", *ODD_NAMES):
        model = config.model_config_list.config.add(
            name=name, base_path=str(base), model_platform="tensorflow"
        )
        for label in ODD_LABELS:
            model.version_labels[label] = 1
    return text_format.MessageToString(config, as_utf8=True)


def predict(channel: grpc.Channel, name: str, label: str = "") -> grpc.StatusCode:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if label:
        request.model_spec.version_label = label
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(ROW))
    try:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def parse(text: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> {label set: value}, by prometheus_client's own text parser (which names a counter's
    samples `*_total`, as OpenMetrics does: `:tensorflow:serving:request_count_total`)."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset(s.labels.items())
            assert labels not in out.setdefault(s.name, {}), f"{s.name}{s.labels} appears twice"
            out[s.name][labels] = s.value
    return out


def promtool_problems(text: str) -> list[str]:
    """`promtool check metrics` findings that are not TF Serving's names (which break its lint by design)."""
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode in (0, 3), problems  # 3: lint findings only; a parse error exits 1
    return [
        p
        for p in problems
        if not (
            p.partition(" ")[0].startswith(":tensorflow:serving:") and p.partition(" ")[2] in TF_SERVING_LINT
        )
    ]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (run `make sysdeps`)")
@pytest.mark.parametrize("workers", [1, 2])
def test_odd_model_names_and_labels_round_trip_through_both_parsers(
    model_repo: Path, tmp_path: Path, workers: int
) -> None:
    config = tmp_path / "models.config"
    config.write_text(config_text(model_repo), encoding="utf-8")
    server = ServerProcess(
        None, tmp_path / "server.log", f"--model_config_file={config}", f"--num_workers={workers}"
    )
    try:
        server.wait_ready()
        sent: dict[tuple[str, str], int] = {}
        with grpc.insecure_channel(server.grpc_target) as channel:
            for name in ODD_NAMES:
                statuses = [predict(channel, name), *(predict(channel, name, label) for label in ODD_LABELS)]
                assert statuses == [grpc.StatusCode.OK] * (1 + len(ODD_LABELS)), (name, statuses)
                unknown = predict(channel, name, 'no "such" label\n')  # a status label other than OK
                assert unknown != grpc.StatusCode.OK
                sent[(name, "OK")] = 1 + len(ODD_LABELS)
                sent[(name, unknown.name)] = 1
        status, text = http(server.url("/monitoring/prometheus/metrics"))
        assert status == 200
        assert promtool_problems(text) == []
        parsed = parse(text)
        counts = {
            (dict(labels)["model_name"], dict(labels)["status"]): value
            for labels, value in parsed[":tensorflow:serving:request_count_total"].items()
        }
        assert {k: v for k, v in counts.items() if k[0] in ODD_NAMES} == sent
        versions = {
            dict(labels)["model_name"]: v for labels, v in parsed["ctr_serving_model_version"].items()
        }
        assert versions == {name: 1 for name in ("ctr", *ODD_NAMES)}
        scored = parsed["ctr_serving_predicted_ctr_count"]
        assert {dict(labels)["model_name"]: v for labels, v in scored.items() if v} == {
            name: 1 + len(ODD_LABELS) for name in ODD_NAMES
        }
        rejected = {dict(labels)["model_name"] for labels in parsed["ctr_serving_versions_rejected_total"]}
        assert rejected == {"ctr", *ODD_NAMES}
    finally:
        server.stop()


def test_every_label_value_and_help_text_is_escaped_in_one_process() -> None:
    metrics = ServingMetrics()
    for name in ODD_NAMES:
        metrics.request_count.inc(name, "OK")
        metrics.request_latency.observe(5.0, name, "predict", "REST")
        metrics.model_version.set(3.0, name)
    metrics.connection_timeouts.help = 'a help with \\ and\na newline and "quotes"'
    text = metrics.render()
    parsed = parse(text)
    assert {dict(k)["model_name"] for k in parsed[":tensorflow:serving:request_count_total"]} == set(
        ODD_NAMES
    )
    assert {dict(k)["model_name"] for k in parsed[":tensorflow:serving:request_latency_bucket"]} == set(
        ODD_NAMES
    )
    [family] = [
        f for f in text_string_to_metric_families(text) if f.name == "ctr_serving_connection_timeouts"
    ]
    assert family.documentation == metrics.connection_timeouts.help


# A worker of `--num_workers`: counts `n` requests and a last-inference time, into the run's directory.
WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from serving.observability.metrics_shared import SharedServingMetrics

    metrics = SharedServingMetrics(Path(sys.argv[1]))
    n = int(sys.argv[2])
    for _ in range(n):
        metrics.request_count.inc("ctr", "OK")
        metrics.batch_size.observe(float(n), "ctr")
    metrics.model_stats.last_inference.set(float(n), "ctr", "1")
    print(__import__("os").getpid())
""")


def run_worker(directory: Path, n: int) -> int:
    result = subprocess.run(
        [sys.executable, "-c", WORKER, str(directory), str(n)],
        cwd=REPO_ROOT,
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    return int(result.stdout)


def test_folding_exited_workers_keeps_every_total_and_one_file(tmp_path: Path) -> None:
    pids = [run_worker(tmp_path, n) for n in (1, 2, 3, 4)]
    scraper = SharedServingMetrics(tmp_path)
    before = scraper.render()
    stats_before = scraper.statistics()
    stop = threading.Event()
    seen: list[str] = []

    def scrape() -> None:  # scrapes while the folds run: each must show the same totals
        while not stop.is_set():
            seen.append(scraper.render())
            # A pause between scrapes, as Prometheus makes: two threads scraping back to back hold the
            # directory's shared lock without a gap, and flock(2) lets readers starve a fold.
            stop.wait(0.02)

    threads = [threading.Thread(target=scrape) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for pid in pids:
            (tmp_path / f"live_{pid}.db").unlink()  # what the parent does first
            assert fold_totals(tmp_path, pid)
            assert not fold_totals(tmp_path, pid)  # folded once only
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    counters = {
        ":tensorflow:serving:request_count_total",
        "ctr_serving_batch_size_count",
        "ctr_serving_batch_size_sum",
    }

    def totals(text: str) -> dict[str, dict[Labels, float]]:
        return {k: v for k, v in parse(text).items() if k in counters or k.endswith("_bucket")}

    assert totals(before)[":tensorflow:serving:request_count_total"] == {
        frozenset({("model_name", "ctr"), ("status", "OK")}): 10
    }
    assert seen and all(totals(text) == totals(before) for text in seen)
    assert totals(scraper.render()) == totals(before)
    assert scraper.statistics() == stats_before  # last_inference is a max, not a sum
    assert stats_before[("ctr", "1")]["last_inference"] == 4
    own = {f"totals_{os.getpid()}.db", f"live_{os.getpid()}.db"}
    assert {p.name for p in tmp_path.iterdir()} == {DEAD_TOTALS, *own}


def test_a_fold_that_cannot_lock_keeps_the_file_and_its_totals(tmp_path: Path) -> None:
    pid = run_worker(tmp_path, 3)
    scraper = SharedServingMetrics(tmp_path)
    stored_before = stored(scraper.render())
    with directory_lock(tmp_path, exclusive=False):  # a scrape that never ends (a stopped worker)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"stayed locked for 0\.2 s"):
            fold_totals(tmp_path, pid, wait_s=0.2)
        assert time.monotonic() - started < 5
    assert (tmp_path / f"totals_{pid}.db").exists() and not (tmp_path / DEAD_TOTALS).exists()
    assert stored(scraper.render()) == stored_before
    assert fold_totals(tmp_path, pid) and stored(scraper.render()) == stored_before


def stored(text: str) -> dict[str, dict[Labels, float]]:
    """What the metric files hold: every sample but this process's live resident memory (it moves by pages)."""
    return {name: v for name, v in parse(text).items() if name != "process_resident_memory_bytes"}


def metrics_files(directory: Path, workers: set[int]) -> set[str]:
    """The folder's file names, checked to name no pid but the live `workers`' (totals_dead.db names none)."""
    names = {p.name for p in directory.iterdir()}
    owners = {int(m[1]) for name in names if (m := re.search(r"_(\d+)\.", name))}
    assert owners == workers, sorted(names)
    return names


def counted(text: str) -> dict[tuple[str, Labels], float]:
    """Every counter and histogram sample of an exposition (what must never go back)."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.type in ("counter", "histogram"):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


@pytest.fixture
def referenced_base(tmp_path: Path, model_repo: Path) -> Path:
    """A copy of the base path whose version has a drift reference: each worker also keeps drift windows."""
    base = tmp_path / "ctr"
    shutil.copytree(model_repo, base)
    rows = np.random.default_rng(3).random((500, WIDTH), np.float32)
    doc = build_reference(rows, rows[:200, :1], {"features": "test", "scores": "test"})
    (base / "1" / DRIFT_REFERENCE_PATH).write_text(json.dumps(doc))
    write_manifest(base / "1", 1)
    return base


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_restarted_workers_lose_no_totals_and_do_not_grow_the_folder(start_server, referenced_base) -> None:
    server = start_server(referenced_base, "--num_workers=2", "--drift_window=100")
    metrics_dir = Path(re.search(r"metrics aggregated in (\S+)", server.log())[1])
    ok = (":tensorflow:serving:request_count_total", frozenset({("model_name", "ctr"), ("status", "OK")}))
    workers = children(server.proc.pid)
    sent = predict_until_served_by(server, workers)
    victim, sizes = min(workers), []
    for restart in range(RESTARTS):  # the victims alternate between the two slots: no crash loop
        time.sleep(2 * FLUSH_S)  # the drift windows are written
        _, before = http(server.url("/monitoring/prometheus/metrics"))
        assert counted(before)[ok] == sent
        names = metrics_files(metrics_dir, workers)
        assert any(name.startswith("drift-features_") for name in names), sorted(names)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while len(children(server.proc.pid) - {victim}) < 2:  # the parent forks a replacement
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        survivor = (workers - {victim}).pop()
        workers = children(server.proc.pid)
        sent += predict_until_served_by(server, workers, timeout_s=30)  # the replacement serves
        _, after = http(server.url("/monitoring/prometheus/metrics"))
        now = counted(after)
        lost = {k: (v, now.get(k)) for k, v in counted(before).items() if now.get(k, -1.0) < v}
        assert not lost, f"restart {restart}: {lost}"
        assert now[ok] == sent
        time.sleep(2 * FLUSH_S)
        names = metrics_files(metrics_dir, workers)
        assert DEAD_TOTALS in names
        sizes.append(len(names))
        victim = survivor
    assert max(sizes) <= 1 + 2 * 6, sizes  # totals_dead.db, and per live worker: live, totals, 4 drift files
