"""The online profile on the engine: simulated traffic, the online trainer publishing, live evaluation, a clean stop.

On the first project, whose `models` volume holds version 1 (the bootstrap) and whose online volumes are new,
`up --profile online` with short intervals (ENV): `traffic` sends the drifting world's requests to `serving`
and writes clicks; `online` joins each closed interval, warm-starts, exports through the (loosened, compose_run)
gate and publishes; `serving` hot-reloads each version; `live-eval` scores each version. Checked from outside:
the model status moves to two versions the trainer published, in turn; live-eval's gauges (its published
metrics port) cover every version served; each new service's healthcheck command, run by hand (podman runs
none without systemd), passes. Then `stop`: every container exits 0 on SIGTERM; the traffic's own counts show no
failed request and answers from each version (the `x-model-version` header); the trainer's state.json holds
every interval from its first to its `next` once, and its published versions are the repository's.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from checks import _get
from compose_run import COMPOSE, Project, check
from engine import Engine
from prometheus_client.parser import text_string_to_metric_families
from sources import say

PROFILE = ("--profile", "online")
SERVICES = ("traffic", "online", "live-eval")
# Short intervals and windows, a small rate and training: two versions within about two minutes.
ENV = {
    "CTR_ONLINE_INTERVAL_S": "20",
    "CTR_ONLINE_WINDOW_S": "4",
    "CTR_ONLINE_TRAIN_ARGS": "--batch-size 256",
    "CTR_TRAFFIC_RATE": "10",
    "CTR_LIVE_MIN_ROWS": "100",
}
PUBLISHED = 2  # versions the trainer must publish (and the server serve) before the stop
DEADLINE_S = 360.0


class Served(threading.Thread):
    """Polls the server's model status: the served version as it changes, with when."""

    def __init__(self, rest: str) -> None:
        super().__init__(daemon=True)
        self.rest, self.stop = rest, threading.Event()
        self.changes: list[tuple[str, float]] = []

    def run(self) -> None:
        while not self.stop.wait(0.5):
            status, body = _get(f"{self.rest}/v1/models/ctr", timeout=2)
            if status != 200:
                continue  # the server is (re)starting
            available = [
                v["version"] for v in json.loads(body)["model_version_status"] if v["state"] == "AVAILABLE"
            ]
            newest = max(available, key=int, default=None)
            if newest and (not self.changes or self.changes[-1][0] != newest):
                self.changes.append((newest, time.monotonic()))

    def versions(self) -> list[str]:
        return [v for v, _ in self.changes]


def _metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A metrics page's samples by name: (labels, value)."""
    status, body = _get(url)
    if status != 200:
        return {}
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _outcomes(url: str) -> dict[str, float]:
    """The trainer's finished intervals by outcome."""
    return {labels["outcome"]: v for labels, v in _metrics(url).get("ctr_online_intervals_total", [])}


def _live_versions(url: str) -> set[str]:
    """The versions live-eval shows an AUC for."""
    return {labels["version"] for labels, _ in _metrics(url).get("ctr_live_auc", [])}


def _save_logs(project: Project) -> None:
    for service in SERVICES:
        text = project.run(*PROFILE, "logs", "--no-color", service, check_rc=False, timeout=60).stdout
        (project.logs / f"online-{service}.log").write_text(text)


def _read(project: Project, service: str, path: str) -> str:
    """A file of a service's volume, read by a one-off container of that service."""
    proc = project.run(*PROFILE, "run", "--rm", "--no-deps", "-T", "--entrypoint", "cat", service, path)
    return proc.stdout


def loop(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """`up --profile online`, two versions published and served, the live figures, a clean stop."""
    try:
        _run(project, engine, times)
    finally:
        _save_logs(project)


def _run(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    rest = f"http://127.0.0.1:{project.ports['rest']}"
    live = f"http://127.0.0.1:{project.ports['live_eval']}/metrics"
    trainer = f"http://127.0.0.1:{project.ports['online']}/metrics"
    project.env.update(ENV)
    start = time.monotonic()
    served = Served(rest)
    served.start()
    project.run(*PROFILE, "up", "-d", "--no-build", timeout=600, log="up-online.log")
    say(
        f"online profile up ({time.monotonic() - start:.0f} s): interval {ENV['CTR_ONLINE_INTERVAL_S']} s, "
        f"window {ENV['CTR_ONLINE_WINDOW_S']} s, {ENV['CTR_TRAFFIC_RATE']} requests/s"
    )
    scored: set[str] = set()
    deadline = start + DEADLINE_S
    wanted: list[str] = []
    while time.monotonic() < deadline:
        scored |= _live_versions(live)
        if not wanted and len(served.versions()) > PUBLISHED:
            wanted = served.versions()  # the versions to see live figures of
            times["online_versions_served_s"] = time.monotonic() - start
        if wanted and set(wanted) <= scored:
            break
        failed = _outcomes(trainer).get("failed", 0)
        check(
            failed < 2,
            f"the trainer failed {failed:.0f} intervals (its log: {project.logs}/online-online.log)",
        )
        for service in SERVICES:
            [cid] = engine.containers(project.name, service, stopped=True) or [""]
            state = engine.container(cid)["State"] if cid else {}
            check(state.get("Running"), f"{service} is not running: {state or 'no container'}")
        time.sleep(2)
    served.stop.set()
    versions = served.versions()
    check(
        len(versions) > PUBLISHED,
        f"in {DEADLINE_S:.0f} s the server served {versions}, not {PUBLISHED} versions after version 1",
    )
    check(
        [int(v) for v in versions] == sorted(int(v) for v in versions) and versions[0] == "1",
        f"the served versions went {versions}",
    )
    check(set(wanted) <= scored, f"live-eval shows an AUC for versions {sorted(scored)}, not all of {wanted}")
    times["online_live_figures_s"] = time.monotonic() - start
    published = _outcomes(trainer).get("published", 0)
    check(published >= PUBLISHED, f"the trainer's metrics count {published} published intervals")
    for service in SERVICES:
        test = COMPOSE["services"][service]["healthcheck"]["test"]
        health = project.run(*PROFILE, "exec", "-T", service, *test[1:], check_rc=False, timeout=60)
        check(
            health.returncode == 0,
            f"{service}'s healthcheck exited {health.returncode}: {health.stderr[-500:]}",
        )
    say(
        f"online: served versions {' -> '.join(versions)} in turn ({times['online_versions_served_s']:.0f} s), "
        f"live-eval AUC for {sorted(scored, key=int)} ({times['online_live_figures_s']:.0f} s); the trainer counts "
        f"{published:.0f} published; healthchecks of {', '.join(SERVICES)} pass"
    )
    _stop(project, engine, times, wanted)


def _stop(project: Project, engine: Engine, times: dict[str, Any], served: list[str]) -> None:
    """SIGTERM to every container: each exits 0; the traffic's counts; the trainer's state and the repository."""
    ids = {s: engine.containers(project.name, s)[0] for s in (*SERVICES, "serving")}
    with_grace = max(float(COMPOSE["services"][s]["stop_grace_period"].rstrip("s")) for s in ids)
    t0 = time.monotonic()
    project.run(*PROFILE, "stop", timeout=with_grace + 60, log="stop-online.log")
    times["online_stop_s"] = time.monotonic() - t0
    exits = {s: engine.container(cid)["State"]["ExitCode"] for s, cid in ids.items()}
    check(set(exits.values()) == {0}, f"exit codes on SIGTERM: {exits}")
    counts = json.loads(_read(project, "traffic", "/traffic/summary.json"))
    check(
        counts["sent"] > 0 and counts["failed"] == 0 and not counts["errors"],
        f"the traffic's counts: {counts}",
    )
    state = json.loads(_read(project, "online", "/online/state.json"))
    listed = _list(project)
    intervals = [o["interval"] for o in state["outcomes"]]
    check(
        intervals and intervals == list(range(intervals[0], state["next"])),
        f"the trainer's state: intervals {intervals}, next {state['next']}",
    )
    recorded = {str(o["version"]) for o in state["outcomes"] if o["outcome"] == "published"}
    pending = {str(state["pending"]["version"])} if state.get("pending") else set()
    repository = {e for e in listed if e.isdigit()} - {"1"}
    check(
        recorded <= repository <= recorded | pending,
        f"published in the state {sorted(recorded)} (pending {state.get('pending')}), in the repository {listed}",
    )
    answered = {v for v, n in counts["answered_by"].items() if n}
    check(
        len(recorded) >= PUBLISHED and set(served) <= answered,
        f"answers by version {counts['answered_by']}; served {served}, published {sorted(recorded)}",
    )
    outcomes = [o["outcome"] for o in state["outcomes"]]
    say(
        f"online stop: exit 0 from {', '.join(exits)} ({times['online_stop_s']:.0f} s); traffic sent "
        f"{counts['sent']} requests, none failed, answers by version {counts['answered_by']}; the trainer's "
        f"state: intervals {intervals[0]}..{state['next'] - 1} ({', '.join(outcomes)}), versions "
        f"{sorted(recorded, key=int)} published, as in the repository"
    )


def _list(project: Project) -> list[str]:
    proc = project.run(
        *PROFILE, "run", "--rm", "--no-deps", "-T", "--entrypoint", "ls", "online", "-A", "/models/ctr"
    )
    return proc.stdout.split()
