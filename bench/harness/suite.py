"""One bench run: make the inputs, measure each section in a bounded child, write results, plots, report.

Exit codes (also in results.json as `exit_code`):
    0   every requested section was measured;
    1   some sections failed (the report names each one and why), the others were measured;
    2   nothing was measured;
    130 interrupted (Ctrl-C or SIGTERM); whatever was measured is still written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness.inputs import PROJECT_ROOT, build_inputs, child_env
from bench.harness.machine import collect_machine
from bench.harness.modes import SECTIONS_WITH_SETUP, STANDALONE_SECTIONS, BenchMode
from bench.harness.procs import StepError, log_tail, run_bounded, start, stop, stop_all
from bench.report.markdown import render_report
from bench.report.plots import write_plots

# Seconds a section gets, after SIGTERM, to stop the servers it started before its group is killed.
SECTION_GRACE_S = 15.0


def _failed(status: str, reason: str, seconds: float = 0.0, log: str | None = None) -> dict[str, Any]:
    return {"status": status, "reason": reason, "seconds": round(seconds, 2), "log": log}


def run_section(
    name: str, mode: BenchMode, inputs_json: Path, workdir: Path, out_dir: Path
) -> dict[str, Any]:
    """Measure one section in a child process group, bounded by the mode's time limit for it."""
    timeout = mode.section_timeout_s[name]
    log = out_dir / "logs" / f"{name}.log"
    result_json = workdir / f"{name}.result.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.section_runner",
        name,
        "--mode",
        mode.name,
        "--inputs",
        str(inputs_json),
        "--workdir",
        str(workdir / name),
        "--out",
        str(result_json),
    ]
    rel_log = str(log.relative_to(out_dir))
    needs_setup = mode.run_setup and name in SECTIONS_WITH_SETUP
    setup_note = prepare_section(name, mode, cmd, log) if needs_setup else None
    print(f"[bench] {name}: measuring (bounded at {timeout:.0f} s, log {log})", flush=True)
    t0 = time.monotonic()
    proc = start(cmd, log=log, env=child_env(), cwd=PROJECT_ROOT)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        stop(proc, grace_s=SECTION_GRACE_S)
    seconds = time.monotonic() - t0
    if rc is None:
        return _failed("failed", f"timed out after {timeout:.0f} s\n{log_tail(log)}", seconds, rel_log)
    result: dict[str, Any] = json.loads(result_json.read_text()) if result_json.is_file() else {}
    if rc != 0:
        reason = result.get("error") or f"exit code {rc}"
        return _failed("failed", f"{reason}\n{log_tail(log)}", seconds, rel_log)
    if not result.get("rows"):
        return _failed("failed", "the section finished but measured no rows", seconds, rel_log)
    notes = [*([setup_note] if setup_note else []), *(result.get("notes") or [])]
    return {**result, "notes": notes, "status": "ok", "seconds": round(seconds, 2), "log": rel_log}


def prepare_section(name: str, mode: BenchMode, cmd: list[str], log: Path) -> str | None:
    """Run the section's one-time setup under its own bound; a failure becomes a note, not a crash.

    Returns:
        A note for the report when the setup failed, else None.
    """
    try:
        run_bounded(
            [*cmd, "--prepare"], timeout_s=mode.prepare_timeout_s, log=log, env=child_env(), cwd=PROJECT_ROOT
        )
    except StepError as e:
        print(f"[bench] {name}: setup failed, measuring what can be measured: {e}", flush=True)
        return f"setup failed: {e}"
    return None


def exit_code(sections: dict[str, dict[str, Any]], interrupted: bool) -> int:
    """0 all measured, 1 some failed, 2 none measured, 130 interrupted (see the module docstring)."""
    if interrupted:
        return 130
    measured = sum(1 for s in sections.values() if s.get("status") == "ok")
    if measured == len(sections):
        return 0
    return 1 if measured else 2


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    """results.json, the PNG plots and report.md into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    plots = write_plots(results, out_dir)
    (out_dir / "report.md").write_text(render_report(results, plots))


def run_bench(
    mode: BenchMode, out_dir: Path, sections: Sequence[str], *, keep_work: bool = False, command: str = ""
) -> dict[str, Any]:
    """Run the requested sections and write everything into `out_dir`.

    Args:
        mode: the run size and time bounds.
        out_dir: gets results.json, report.md, the plots and logs/.
        sections: which of SECTIONS to measure, in order.
        keep_work: keep `out_dir/work` (data, checkpoint, model repository) instead of deleting it.
        command: the command line, recorded in the report.

    Returns:
        The results dict, with `exit_code` set.
    """
    t0 = time.monotonic()
    workdir = out_dir / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "schema": 1,
        "mode": mode.name,
        "command": command,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": collect_machine(),
        "pipeline": {"status": "not run"},
        "sections": {name: _failed("not run", "the run ended before this section") for name in sections},
    }
    interrupted = False
    try:
        inputs_json = workdir / "inputs.json"
        inputs_json.write_text("{}")
        pipeline_error = None
        if any(s not in STANDALONE_SECTIONS for s in sections):
            p0 = time.monotonic()
            try:
                outputs = build_inputs(mode, workdir, out_dir / "logs")
                results["pipeline"] = {
                    "status": "ok",
                    "seconds": round(time.monotonic() - p0, 2),
                    **outputs.to_json(),
                }
                inputs_json.write_text(json.dumps(outputs.to_json()))
            except (StepError, OSError, ValueError) as e:
                pipeline_error = str(e)
                results["pipeline"] = _failed("failed", pipeline_error, time.monotonic() - p0)
                print(f"[bench] pipeline failed: {e}", flush=True)
        for name in sections:
            if name not in STANDALONE_SECTIONS and pipeline_error is not None:
                results["sections"][name] = _failed(
                    "failed", f"needs the exported model, but the pipeline failed:\n{pipeline_error}"
                )
                continue
            results["sections"][name] = sec = run_section(name, mode, inputs_json, workdir, out_dir)
            print(f"[bench] {name}: {sec['status']} in {sec['seconds']:.0f} s", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("[bench] interrupted: stopping every child process", flush=True)
        for sec in results["sections"].values():
            if sec["status"] == "not run":
                sec.update(_failed("interrupted", "the run was interrupted (Ctrl-C or SIGTERM)"))
    finally:
        stop_all()
        results["wall_seconds"] = round(time.monotonic() - t0, 2)
        results["exit_code"] = exit_code(results["sections"], interrupted)
        write_outputs(results, out_dir)
        if not keep_work:
            shutil.rmtree(workdir, ignore_errors=True)
    return results
