"""Export loads a checkpoint and runs the network with training/ and serving/ out of reach (the trainer image
holds both stages, but export needs only ctr_contract, ctr_features and ctr_model)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHECKPOINT = Path(__file__).parents[1] / "ctr_model" / "checkpoint_before_issue17.ckpt"


def test_export_imports_and_loads_a_checkpoint_without_training_or_serving() -> None:
    script = textwrap.dedent(f"""
        import sys
        for blocked in ("training", "serving", "pipelines", "bench"):
            sys.modules[blocked] = None  # any import of them now raises ImportError
        import torch
        import export.__main__, export.pipeline
        from ctr_model.checkpoint import load_net
        from ctr_model.errors import CheckpointError
        net, _ = load_net({str(CHECKPOINT)!r})
        print(tuple(net.predict_proba(torch.zeros(3, net.cfg.width)).shape))
        try:
            load_net({str(CHECKPOINT.with_name("absent.ckpt"))!r})
        except CheckpointError as e:
            print(e)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "(3, 1)"
    assert proc.stdout.splitlines()[1] == f"checkpoint not found: {CHECKPOINT.with_name('absent.ckpt')}"
