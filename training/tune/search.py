"""`python -m training.tune`: search lr, batch size, dropout, weight decay and activation with Optuna.

    python -m training.tune --data artifacts/data/train.txt --trials 20 --max-rows 200000 --out artifacts/tune

A seeded TPE sampler proposes each trial's parameters; the trial trains in its own process
(`python -m training.tune.trial`), reports val AUC after every epoch, and the median pruner stops weak ones
early. A trial that crashes or passes --trial-timeout is recorded as failed and the study goes on. The study
lives in OUT/study.db (SQLite), so `--resume` continues it. Writes OUT/best.json (train with it:
`make train ARGS="--config OUT/best.json"`), OUT/optimization_history.png and, with enough trials,
OUT/param_importances.png. Exit code 0 when a trial completed, 1 when none did, 2 on bad arguments, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
from optuna.trial import TrialState

from training.tune.params import suggest
from training.tune.plots import write_plots
from training.tune.trial import build_pruner

STUDY_NAME = "ctr"
DB_NAME = "study.db"
BEST_JSON = "best.json"


def trial_command(
    args: argparse.Namespace, trial: optuna.Trial, params: dict[str, Any], run_dir: Path
) -> list[str]:
    """The child command that trains one trial."""
    # The storage id, not the number: the child rebuilds the trial with `optuna.Trial(study, trial_id)`, and
    # Optuna has no public accessor for it.
    cmd = [
        sys.executable,
        "-m",
        "training.tune.trial",
        "--storage",
        storage_url(args.out),
        "--study",
        STUDY_NAME,
        "--trial-id",
        str(trial._trial_id),
        "--params",
        json.dumps(params),
        "--data",
        str(args.data),
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.train_seed),
        "--out",
        str(run_dir),
        "--result",
        str(run_dir / "result.json"),
    ]
    return cmd + (["--max-rows", str(args.max_rows)] if args.max_rows else [])


def storage_url(out: Path) -> str:
    return f"sqlite:///{(out / DB_NAME).resolve()}"


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the trial's process group, SIGKILL after 5 s, and reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
            return


def _last_line(log: Path) -> str:
    lines = (
        [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        if log.is_file()
        else []
    )
    return lines[-1][:300] if lines else "(empty log)"


def run_one(study: optuna.Study, args: argparse.Namespace) -> tuple[optuna.trial.FrozenTrial, str]:
    """Ask for a trial, train it in a child process, tell the study how it ended.

    Returns:
        The finished trial and a note for the progress line (why it failed, or where it was pruned).
    """
    trial = study.ask()
    params = suggest(trial)
    run_dir = args.out / "trials" / f"{trial.number:04d}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "trial.log"
    result_file = run_dir / "result.json"
    result_file.unlink(missing_ok=True)
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            trial_command(args, trial, params, run_dir),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        rc: int | None = proc.wait(timeout=args.trial_timeout)
    except subprocess.TimeoutExpired:
        rc = None
    except KeyboardInterrupt:
        _stop_group(proc)
        study.tell(trial, state=TrialState.FAIL)
        raise
    finally:
        _stop_group(proc)
    result = json.loads(result_file.read_text()) if rc == 0 and result_file.is_file() else {}
    if result.get("state") == "complete":
        frozen = study.tell(trial, float(result["val_auc"]))
        note = ""
    elif result.get("state") == "pruned":
        frozen = study.tell(trial, state=TrialState.PRUNED)
        note = f" after epoch {result['epoch']}"
    else:
        frozen = study.tell(trial, state=TrialState.FAIL)
        why = f"timed out after {args.trial_timeout:g} s" if rc is None else f"exit code {rc}"
        note = f" ({why}; {log}: {_last_line(log)})"
    return frozen, note


def _fmt_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def progress_line(
    i: int, n: int, t: optuna.trial.FrozenTrial, note: str, study: optuna.Study, seconds: float
) -> str:
    """`[tune] trial 3/20 (#2) COMPLETE val AUC 0.7412 | best 0.7420 (#1) | 14.2 s | lr=... batch_size=...`"""
    value = f" val AUC {t.value:.4f}" if t.state == TrialState.COMPLETE and t.value is not None else ""
    complete = [x for x in study.trials if x.state == TrialState.COMPLETE]
    best = max(complete, key=lambda x: x.value or 0.0) if complete else None
    best_text = f"best {best.value:.4f} (#{best.number})" if best else "best –"
    return f"[tune] trial {i}/{n} (#{t.number}) {t.state.name}{note}{value} | {best_text} | {seconds:.1f} s | {_fmt_params(t.params)}"


def write_best(study: optuna.Study, args: argparse.Namespace, command: str) -> dict[str, Any] | None:
    """OUT/best.json: the best complete trial's parameters, its val AUC and the trial counts; None if none."""
    states = [t.state for t in study.trials]
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not complete:
        return None
    best = max(complete, key=lambda t: t.value or 0.0)
    doc = {
        "params": best.params,
        "val_auc": best.value,
        "trial": best.number,
        "trials": {
            "total": len(states),
            "complete": len(complete),
            "pruned": states.count(TrialState.PRUNED),
            "failed": states.count(TrialState.FAIL),
        },
        "data": str(args.data),
        "max_rows": args.max_rows,
        "max_epochs": args.epochs,
        "storage": storage_url(args.out),
        "study": STUDY_NAME,
        "sampler": f"TPESampler(seed={args.sampler_seed})",
        "command": command,
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (args.out / BEST_JSON).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def open_study(args: argparse.Namespace) -> optuna.Study:
    """Create the study in OUT/study.db, or load it with --resume (stale RUNNING trials are marked failed)."""
    exists = (args.out / DB_NAME).is_file()
    if exists and not args.resume:
        raise FileExistsError(
            f"{args.out / DB_NAME} already holds a study; pass --resume to continue it or choose another --out"
        )
    if args.resume and exists:
        done = len(optuna.load_study(study_name=STUDY_NAME, storage=storage_url(args.out)).trials)
        args.sampler_seed = (
            args.seed + done
        )  # a fresh RNG stream: do not redraw the first run's startup trials
    study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=storage_url(args.out),
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=args.sampler_seed),
        pruner=build_pruner(),
        load_if_exists=args.resume,
    )
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
        print(f"[tune] trial #{t.number} was left running by an interrupted run: recorded as failed")
    if args.resume:
        print(f"[tune] resuming {storage_url(args.out)}: {len(study.trials)} trials so far")
    return study


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.tune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data", type=Path, default=Path("artifacts/data/train.txt"), help="Criteo file to train on"
    )
    p.add_argument("--trials", type=int, default=20, help="trials to run now (added to a resumed study)")
    p.add_argument("--max-rows", type=int, default=None, help="use only the first N rows of the file")
    p.add_argument("--epochs", type=int, default=3, help="epochs per trial (default 3)")
    p.add_argument(
        "--out", type=Path, default=Path("artifacts/tune"), help="study.db, best.json, PNGs, trials/"
    )
    p.add_argument("--resume", action="store_true", help="continue the study in OUT/study.db")
    p.add_argument("--seed", type=int, default=42, help="TPE sampler seed (default 42)")
    p.add_argument("--train-seed", type=int, default=42, help="weights and shuffling seed of every trial")
    p.add_argument(
        "--trial-timeout", type=float, default=3600, help="seconds before a trial is killed (failed)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bad = [
        f"--{k} must be >= 1, got {getattr(args, k)}" for k in ("trials", "epochs") if getattr(args, k) < 1
    ]
    if not args.data.is_file():
        bad.append(f"--data {args.data}: no such file (`make data` generates one)")
    if bad:
        print("error: " + "; ".join(bad), file=sys.stderr)
        return 2
    args.sampler_seed = args.seed
    args.out.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress line below is the output
    try:
        study = open_study(args)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "training.tune", *(sys.argv[1:] if argv is None else argv)])
    signal.signal(signal.SIGTERM, _raise_interrupt)
    interrupted = False
    try:
        for i in range(1, args.trials + 1):
            t0 = time.monotonic()
            frozen, note = run_one(study, args)
            print(progress_line(i, args.trials, frozen, note, study, time.monotonic() - t0), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("[tune] interrupted: the running trial is recorded as failed", flush=True)
    best = write_best(study, args, command)
    write_plots(study, args.out)
    if best is None:
        print(f"[tune] no trial completed; each trial's log is under {args.out / 'trials'}", file=sys.stderr)
        return 130 if interrupted else 1
    print(
        f"[tune] best val AUC {best['val_auc']:.4f} (trial #{best['trial']}, {best['trials']['total']} trials): "
        f'{args.out / BEST_JSON}\n[tune] train with it: make train ARGS="--config {args.out / BEST_JSON}"'
    )
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
