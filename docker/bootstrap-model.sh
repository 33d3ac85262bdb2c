#!/bin/sh
# One-shot model bootstrap (compose services `model` and `model-s3`): when the model repository holds no version
# yet, generate the built-in data set (if absent), train on it and export version 1. Otherwise do nothing,
# so `docker compose up serving` is fast after the first time and never overwrites a model.
# MODEL_BASE_PATH is a folder or a bucket path, s3://BUCKET/PREFIX (the store from boto3's variables, as export
# reads them); a bucket the store is still making is waited for, STORE_WAIT_S seconds at most.
# Every setting comes from the environment; the defaults are the container's paths.
set -eu

MODEL_BASE_PATH="${MODEL_BASE_PATH:-/models/ctr}"   # the serving model base path (versions are subfolders)
WORK_DIR="${WORK_DIR:-/artifacts}"                  # data and the training run
ROWS="${ROWS:-200000}"                              # rows of synthetic data when no data file exists
SEED="${SEED:-7}"
TRAIN_ARGS="${TRAIN_ARGS:-}"                         # extra flags for `python -m training`
PYTHON="${PYTHON:-python}"
STORE_WAIT_S="${STORE_WAIT_S:-120}"

# The newest complete version in a bucket: one delimited listing, then the manifests from the newest down (a
# version without its manifest is an upload still running, or one a failed export left: not a version).
LATEST_IN_BUCKET='
import sys, time
from ctr_store.errors import NO_BUCKET, NOT_FOUND, TIMEOUT, UNREACHABLE, StoreError
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import VersionIncomplete, list_versions, read_manifest

base, wait_s = BucketPath.parse(sys.argv[1]), float(sys.argv[2])
deadline = time.monotonic() + wait_s
while True:
    try:
        store = ObjectStore()
        store.check_bucket(base)
        versions = sorted(list_versions(store, base), reverse=True)
        break
    except StoreError as exc:
        # A bucket not made yet: HEAD answers 404 with no body (not_found), a listing NoSuchBucket (no_bucket).
        if exc.reason not in (NO_BUCKET, NOT_FOUND, UNREACHABLE, TIMEOUT) or time.monotonic() > deadline:
            sys.exit(f"bootstrap: {base}: {exc} (waited up to {wait_s:.0f} s, STORE_WAIT_S)")
        time.sleep(1)
for version in versions:
    try:
        read_manifest(store, base, version)
    except VersionIncomplete:
        continue
    print(version)
    break
'

case "$MODEL_BASE_PATH" in
s3://*)
    latest=$("$PYTHON" -c "$LATEST_IN_BUCKET" "$MODEL_BASE_PATH" "$STORE_WAIT_S")
    ;;
*)
    # A version is a folder named by digits only; a half-written temporary folder does not count.
    latest=$(find "$MODEL_BASE_PATH" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9][0-9]*' -printf '%f\n' 2>/dev/null \
        | sort -n | tail -n 1)
    ;;
esac
if [ -n "$latest" ]; then
    echo "model repository $MODEL_BASE_PATH already holds version $latest; nothing to do"
    exit 0
fi

data="$WORK_DIR/data/train.txt"
run="$WORK_DIR/run"
if [ ! -f "$data" ]; then
    echo "no data at $data: generating $ROWS synthetic rows"
    "$PYTHON" -m training.synth --out "$data" --rows "$ROWS" --seed "$SEED"
fi
# metrics.json is the last file training writes: a run that has it is complete (a bootstrap stopped during
# the export resumes there, without training twice).
if [ -f "$run/metrics.json" ]; then
    echo "$run is a complete training run (metrics.json): exporting it without training again"
else
    echo "training on $data into $run"
    # TRAIN_ARGS is split into flags on purpose.
    # shellcheck disable=SC2086
    "$PYTHON" -m training --data "$data" --out "$run" $TRAIN_ARGS
fi
echo "exporting $run into $MODEL_BASE_PATH"
"$PYTHON" -m export --run "$run" --repo "$MODEL_BASE_PATH"
