#!/usr/bin/env bash
# One day of the daily loop (docs/daily-loop.md): `scripts/daily.sh N` or `make day N=1`.
#   1. data: take $DATA, or generate day N of the drifting synthetic world (python -m training.synth --day N);
#   2. train: warm-start from the newest published version (what the server serves) for $EPOCHS epoch(s),
#      or train from scratch when the repository holds no version yet;
#   3. export through the quality gate (scored on day N's validation rows against the newest version);
#      a refused candidate ends the day here with `export: error: ...` and exit code 1;
#   4. serving: every server polling $REPO loads the new version and swaps to it without dropping a request.
# Settings come from the environment (defaults in brackets).
set -euo pipefail

N="${1:?usage: scripts/daily.sh DAY   (DAY = 0, 1, 2, ...)}"
PY="${PY:-.venv/bin/python}"              # [.venv/bin/python]
REPO="${REPO:-artifacts/models/ctr}"      # the model base path the servers poll (a folder or s3://BUCKET/PREFIX)
WORK="${WORK:-artifacts/daily}"           # data and run directories, one per day
ROWS="${ROWS:-500000}"                    # rows generated per day (~500k new log rows a day)
EPOCHS="${EPOCHS:-1}"                     # warm-start epochs
DATA="${DATA:-}"                          # a day's Criteo file (e.g. from python -m pipelines.clicks --format criteo)
TRAIN_ARGS="${TRAIN_ARGS:-}"              # extra flags for python -m training (split into words)
EXPORT_ARGS="${EXPORT_ARGS:-}"            # extra flags for python -m export, e.g. --force
# With the OTEL_* variables set, training and export send a span per stage (ctr_contract/stage_trace.py), both
# under this trace context, so a day is one trace (a caller's own TRACEPARENT is kept).
TRACEPARENT="${TRACEPARENT:-00-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')-$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')-01}"
export TRACEPARENT

data="${DATA:-$WORK/data/day$N.txt}"
run="$WORK/runs/day$N"
if [ -z "$DATA" ] && [ ! -f "$data" ]; then
    echo "day $N: generating $ROWS rows into $data"
    "$PY" -m training.synth --day "$N" --rows "$ROWS" --out "$data"
fi

if [[ "$REPO" == s3://* ]]; then
    # A bucket (AWS_* variables, docs/export.md): its newest published version, downloaded and checked.
    base=$("$PY" -m pipelines.online.published --repo "$REPO" --into "$WORK/versions")
else
    # `|| true`: a REPO that does not exist yet is an empty one (under pipefail, find's failure would end the day)
    newest=$({ find "$REPO" -mindepth 1 -maxdepth 1 -type d -regex '.*/[1-9][0-9]*' -printf '%f\n' 2>/dev/null \
        || true; } | sort -n | tail -n 1)
    base="${newest:+$REPO/$newest}"
fi
if [ -n "$base" ]; then
    echo "day $N: warm start from $base ($EPOCHS epoch(s), feature spec frozen)"
    # shellcheck disable=SC2086  # TRAIN_ARGS is split into flags on purpose
    "$PY" -m training --data "$data" --out "$run" --init-from "$base" --max-epochs "$EPOCHS" \
        --no-progress-bar $TRAIN_ARGS
else
    echo "day $N: $REPO holds no version yet: training from scratch"
    # shellcheck disable=SC2086
    "$PY" -m training --data "$data" --out "$run" --no-progress-bar $TRAIN_ARGS
fi

echo "day $N: export through the quality gate"
# shellcheck disable=SC2086
"$PY" -m export --run "$run" --repo "$REPO" $EXPORT_ARGS
echo "day $N: published; servers polling $REPO load it at their next scan"
