#!/usr/bin/env bash
# The warm-start measurement of docs/daily-loop.md: on day 1's held-out rows, a day-0 model that was not
# updated, a warm start from it (1 epoch on day 1) and a full retrain on days 0-1; on day 5, the day-0 model
# against a model trained on day 5. Every model is scored through its own feature spec.
#   ROWS=200000 scripts/measure_daily.sh OUT_DIR
set -euo pipefail

OUT="${1:?usage: scripts/measure_daily.sh OUT_DIR}"
ROWS="${ROWS:-200000}"
PY="${PY:-.venv/bin/python}"
mkdir -p "$OUT"
for d in 0 1 5; do
    [ -f "$OUT/day$d.txt" ] || "$PY" -m training.synth --day "$d" --rows "$ROWS" --out "$OUT/day$d.txt"
done

# days01.txt: all of day 0 + day 1 without its validation rows, which stay unseen by every model.
[ -f "$OUT/days01.txt" ] || "$PY" - "$OUT/day0.txt" "$OUT/day1.txt" "$OUT/days01.txt" <<'EOF'
import shutil, sys
import numpy as np
from ctr_features.data.split import validation_mask
day0, day1, out = sys.argv[1:]
lines = open(day1).read().splitlines(keepends=True)
held_out = validation_mask(np.arange(len(lines)), 0.1)
shutil.copyfile(day0, out)
with open(out, "a") as f:
    f.writelines(line for line, v in zip(lines, held_out) if not v)
EOF

# A run that finished already (its metrics.json exists) is kept: the script can be rerun to score again.
train() { [ -f "$1/metrics.json" ] || "$PY" -m training --no-progress-bar --out "$@" | tail -n 2; }
train "$OUT/run0" --data "$OUT/day0.txt"
train "$OUT/warm1" --data "$OUT/day1.txt" --init-from "$OUT/run0" --max-epochs 1
train "$OUT/retrain01" --data "$OUT/days01.txt"
train "$OUT/run5" --data "$OUT/day5.txt"

score() {
    "$PY" - "$@" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np, torch
from export.gates.gate import figures, rows_from_file
from ctr_model.checkpoint import load_net
from ctr_features.data.split import validation_mask
from training.synth import oracle_paths
data, runs = Path(sys.argv[1]), sys.argv[2:]
rows = rows_from_file(data, val_fraction=0.1, max_rows=10**9)  # the day's validation split
truth = np.load(oracle_paths(data)[0])
oracle = truth[validation_mask(np.arange(len(truth)), 0.1)]
print(f"{data.name}: {len(rows.labels)} held-out rows, oracle AUC {figures(rows.labels, oracle)['auc']:.4f}")
for run in map(Path, runs):
    net, _ = load_net(run / "checkpoints/best.ckpt")
    with torch.no_grad():
        p = net.predict_proba(torch.from_numpy(rows.features_for(run / "feature_spec.json"))).numpy()
    f, m = figures(rows.labels, p), json.loads((run / "metrics.json").read_text())
    print(f"  {run.name:10s} AUC {f['auc']:.4f}  ECE {f['ece']:.4f}  mean predicted {f['mean_predicted_ctr']:.4f} "
          f"(observed {f['observed_ctr']:.4f})  trained {m['epochs']} epochs in {m['wall_seconds']:.0f} s")
EOF
}
score "$OUT/day1.txt" "$OUT/run0" "$OUT/warm1" "$OUT/retrain01"
score "$OUT/day5.txt" "$OUT/run0" "$OUT/run5"
