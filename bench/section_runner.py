"""One measured section in its own process: `python -m bench.section_runner SECTION --inputs J --out J`.

The orchestrator runs each section as a child in its own process group, so a section that hangs is
killed at its time bound, and TensorFlow and PyTorch never share one interpreter across sections.
SIGTERM becomes KeyboardInterrupt here, so the measurement modules' `finally` blocks stop their servers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from bench.harness.modes import SECTIONS
from bench.harness.procs import raise_interrupt


def _optional_path(value: Any) -> Path | None:
    return Path(value) if value else None


def measure(section: str, mode: str, inputs: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Call the section's measurement module with the pipeline's artifacts.

    Args:
        section: one of SECTIONS.
        mode: "full", "quick" or "tiny", passed through to the module.
        inputs: `PipelineOutputs.to_json()` (empty when the section needs none).
        workdir: scratch space for the section.

    Returns:
        The module's result dict (`rows`, `commands`, ...).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if section == "training":
        from bench.sections import training_throughput

        return training_throughput.run(mode, workdir)
    if section == "scaling":
        from bench.sections import scaling

        return scaling.run(mode, workdir)
    checkpoint = _optional_path(inputs.get("checkpoint"))
    if checkpoint is not None and not checkpoint.is_file():
        checkpoint = None
    if section == "inference":
        from bench.sections import inference_latency

        # Same intra-op thread count for every backend (one per usable core): a fair comparison,
        # instead of each framework's own default (ORT, torch and TF pick differently).
        threads = len(os.sched_getaffinity(0))
        return inference_latency.run(mode, Path(inputs["version_dir"]), checkpoint, threads, workdir)
    if section == "serving":
        from bench.sections import serving_load

        return serving_load.run(mode, Path(inputs["model_base_path"]), workdir, checkpoint)
    raise ValueError(f"unknown section {section!r}; expected one of {SECTIONS}")


def prepare(section: str, workdir: Path) -> str | None:
    """One-time setup a section needs that must not count against its time bound (e.g. installing KServe).

    Returns:
        What was prepared, or None when the section needs nothing.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    from bench.harness import foreign_venvs

    # JAX, MLX and TorchServe failures are recorded in the workdir and shown in their rows, not raised.
    venvs = {
        "training": (foreign_venvs.JAX, foreign_venvs.MLX),
        "inference": (foreign_venvs.JAX,),
        "serving": (foreign_venvs.TORCHSERVE,),
    }.get(section, ())
    lines = foreign_venvs.prepare(venvs, workdir)
    if section == "serving":
        python = foreign_venvs.KSERVE.ensure(workdir / "kserve_install.log")
        lines.append(f"KServe environment ready: {python}")
    return "; ".join(lines) or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.section_runner", description=__doc__)
    parser.add_argument("section", choices=SECTIONS)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--inputs", type=Path, required=True, help="pipeline outputs (JSON)")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the section's result JSON goes")
    parser.add_argument("--prepare", action="store_true", help="only do the section's one-time setup")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)
    if args.prepare:
        print(prepare(args.section, args.workdir) or f"section {args.section} needs no setup")
        return 0
    inputs = json.loads(args.inputs.read_text()) if args.inputs.is_file() else {}
    try:
        result: dict[str, Any] = measure(args.section, args.mode, inputs, args.workdir)
        code = 0
    except Exception as e:  # any failure is the section's result; the orchestrator reports it
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
        code = 1
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    tmp.replace(args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
