"""`make fuzz`'s driver: replay the regression corpus, then fuzz each target for a bounded time, then a summary.

    python fuzz/run.py --lib build/fuzz/lib --seconds 60 [TARGET ...]

Every target (fuzz/targets.py) runs in its own process with the ASan + UBSan build of the extensions from
`--lib` (built by `make fuzz`, never the in-place ones) and atheris's libFuzzer with the sanitizer runtime
preloaded. First every file of fuzz/corpus/<target>/ is replayed (a crash there names the file); then
libFuzzer runs for `--seconds`, starting from that corpus, writing what it finds to build/fuzz/work/<target>/
(the committed corpus is only read). A crash (a sanitizer report, a failed assertion, an uncaught exception)
names the target and the input, which is copied into fuzz/corpus/<target>/ so that it stays a regression
test, and the exit status is 1. The summary gives each target's executions and coverage (libFuzzer's
`cov`: edges of the instrumented C and Python; `ft`: features).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
WORK = ROOT / "build" / "fuzz"
INSTRUMENTED = ["serving.codecs", "ctr_features.compiled"]  # the Python the targets reach
STATS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")


def sanitizer_env(lib: str) -> dict[str, str]:
    import atheris

    env = dict(os.environ)
    env["LD_PRELOAD"] = str(Path(atheris.path()) / "asan_with_fuzzer.so")
    env["ASAN_OPTIONS"] = "detect_leaks=0:allocator_may_return_null=1:handle_abort=1:symbolize=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    env["PYTHONMALLOC"] = "malloc"  # every allocation through ASan's malloc, so overflows of objects show
    env["PYTHONPATH"] = str(ROOT)
    env["FUZZ_LIB"] = lib
    return env


def child_replay(target: str) -> int:
    """Feed every corpus file of `target` to it once, naming each before it runs (a sanitizer abort names it)."""
    from fuzz import targets

    targets.load_native(os.environ.get("FUZZ_LIB") or None)
    files = sorted(p for p in (CORPUS / target).glob("*") if p.is_file())
    for path in files:
        print(f"replay {path.relative_to(ROOT)}", flush=True)
        try:
            targets.TARGETS[target](path.read_bytes())
        except Exception:
            traceback.print_exc()
            print(f"REPLAY FAILED: target {target}, input {path.relative_to(ROOT)}", flush=True)
            return 1
    print(f"replayed {len(files)} inputs", flush=True)
    return 0


def child_fuzz(target: str, seconds: int) -> None:
    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED):
        from fuzz import targets

        targets.load_native(os.environ.get("FUZZ_LIB") or None)
        import serving.codecs.raw_body
        import serving.codecs.rest_codec  # noqa: F401
    work, crashes = WORK / "work" / target, WORK / "crashes" / target
    work.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    args = [
        sys.argv[0],
        f"-max_total_time={seconds}",
        f"-artifact_prefix={crashes}/",
        "-print_final_stats=1",
        "-timeout=20",
        "-rss_limit_mb=6144",
        "-max_len=8192",
        str(work),
        str(CORPUS / target),
    ]
    atheris.Setup(args, targets.TARGETS[target])
    atheris.Fuzz()


def run_target(target: str, seconds: int, env: dict[str, str]) -> dict[str, object]:
    """Replay, then fuzz, one target in child processes: its numbers, and the crash input if any."""
    me = [sys.executable, str(Path(__file__).resolve())]
    log = WORK / "logs" / f"{target}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"target": target, "crash": None}
    replay = subprocess.run(
        [*me, "--child-replay", target], env=env, capture_output=True, text=True, check=False
    )
    log.write_text(replay.stdout + replay.stderr)
    result["replayed"] = len(re.findall(r"^replay ", replay.stdout, re.M))
    if replay.returncode != 0:
        named = re.findall(r"^replay (\S+)", replay.stdout, re.M)
        sys.stderr.write(replay.stdout[-4000:] + replay.stderr[-8000:])
        result["crash"] = named[-1] if named else "?"
        result["phase"] = "replay"
        return result
    if seconds <= 0:  # libFuzzer's -max_total_time=0 is no limit: replay only
        return result
    start = time.monotonic()
    fuzz = subprocess.run(
        [*me, "--child-fuzz", target, "--seconds", str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    output = fuzz.stdout + fuzz.stderr
    with log.open("a") as f:
        f.write(output)
    result["seconds"] = round(time.monotonic() - start)
    stats = STATS.findall(output)
    runs = re.findall(r"stat::number_of_executed_units: (\d+)", output)
    if stats:
        last = stats[-1]
        result.update(execs=int(runs[-1]) if runs else int(last[0]), cov=int(last[1]), ft=int(last[2]))
        result["corpus"] = int(last[3])
    if fuzz.returncode != 0:
        sys.stderr.write(output[-8000:])
        written = re.findall(r"Test unit written to (\S+)", output)
        result["phase"] = "fuzz"
        if written:
            saved = Path(written[-1])
            kept = CORPUS / target / saved.name
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(saved, kept)
            result["crash"] = str(kept.relative_to(ROOT))
        else:
            result["crash"] = f"(no input written; rc {fuzz.returncode}, see {log.relative_to(ROOT)})"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="targets to run (default: all of fuzz/targets.py)")
    parser.add_argument(
        "--lib", default="build/fuzz/lib", help="the sanitizer build (default: build/fuzz/lib)"
    )
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time per target (default: 60)")
    parser.add_argument("--replay-only", action="store_true", help="replay the corpus only (default: off)")
    parser.add_argument("--child-replay", help=argparse.SUPPRESS)
    parser.add_argument("--child-fuzz", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_replay:
        return child_replay(args.child_replay)
    if args.child_fuzz:
        child_fuzz(args.child_fuzz, args.seconds)
        return 0
    from fuzz.targets import NAMES

    env = sanitizer_env(str(Path(args.lib).resolve()))
    results = [run_target(t, 0 if args.replay_only else args.seconds, env) for t in (args.targets or NAMES)]
    print(
        f"\nfuzz summary ({'replay only' if args.replay_only else f'{args.seconds} s a target'}, ASan + UBSan):"
    )
    print(
        f"  {'target':<13} {'replayed':>8} {'seconds':>7} {'executions':>11} {'cov':>6} {'ft':>7} {'corpus':>6}  crash"
    )
    for r in results:
        print(
            f"  {r['target']:<13} {r['replayed']:>8} {r.get('seconds', '-'):>7} {r.get('execs', '-'):>11} "
            f"{r.get('cov', '-'):>6} {r.get('ft', '-'):>7} {r.get('corpus', '-'):>6}  {r['crash'] or 'none'}"
        )
    crashed = [r for r in results if r["crash"]]
    for r in crashed:
        print(f"FUZZ CRASH: target {r['target']} ({r['phase']}), input {r['crash']}", file=sys.stderr)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
