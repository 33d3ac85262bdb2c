#!/bin/sh
# The objectstore image's entrypoint (docker/Dockerfile.objectstore): SeaweedFS with one S3 identity from the
# environment, the buckets of OBJECTSTORE_BUCKETS made once it answers, then the server until SIGTERM.
#   OBJECTSTORE_ACCESS_KEY, OBJECTSTORE_SECRET_KEY   the key pair S3 clients sign with (required)
#   OBJECTSTORE_BUCKETS                              bucket names made at start, space-separated (default: models)
#   OBJECTSTORE_DIR                                  the data (default: /data, a volume)
# Only the S3 gateway (:8333) is for clients; the master, volume server and filer advertise 127.0.0.1.
set -eu

: "${OBJECTSTORE_ACCESS_KEY:?set OBJECTSTORE_ACCESS_KEY and OBJECTSTORE_SECRET_KEY: the key pair S3 clients sign with}"
: "${OBJECTSTORE_SECRET_KEY:?set OBJECTSTORE_SECRET_KEY: the secret of OBJECTSTORE_ACCESS_KEY}"
BUCKETS="${OBJECTSTORE_BUCKETS:-models}"
DATA="${OBJECTSTORE_DIR:-/data}"
CONFIG=/tmp/s3.json
READY=/tmp/objectstore-ready
MASTER=127.0.0.1:9333
START_DEADLINE_S="${OBJECTSTORE_START_DEADLINE_S:-60}"

# The identity file, written by Python's json (any secret stays valid JSON) and readable by this user only.
rm -f "$READY"
umask 077
python -c '
import json, os, sys
identity = {"name": "ctr", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            "credentials": [{"accessKey": os.environ["OBJECTSTORE_ACCESS_KEY"],
                             "secretKey": os.environ["OBJECTSTORE_SECRET_KEY"]}]}
json.dump({"identities": [identity]}, sys.stdout)
' > "$CONFIG"
umask 022

# S3 only: the gateway's Iceberg catalog and Lance listeners are off (port 0).
weed server -dir="$DATA" -ip=127.0.0.1 -ip.bind=0.0.0.0 -volume.max=100 -master.volumeSizeLimitMB=1024 \
    -s3 -s3.port=8333 -s3.config="$CONFIG" -s3.port.iceberg=0 -s3.port.lance=0 &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' TERM INT

# The gateway answers its health route once the filer behind it is up.
python -c '
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
while True:
    try:
        urllib.request.urlopen("http://127.0.0.1:8333/healthz", timeout=2).read()
        break
    except OSError as exc:
        if time.monotonic() > deadline:
            sys.exit(f"objectstore: the S3 gateway did not answer within {sys.argv[1]} s ({exc})")
        time.sleep(0.5)
' "$START_DEADLINE_S" || { kill -TERM "$pid" 2>/dev/null || true; exit 1; }

existing=$(echo "s3.bucket.list" | weed shell -master="$MASTER" 2>/dev/null | awk '{print $1}')
for bucket in $BUCKETS; do
    if printf '%s\n' "$existing" | grep -qx "$bucket"; then
        echo "objectstore: bucket $bucket already exists"
    else
        echo "s3.bucket.create -name $bucket" | weed shell -master="$MASTER" >/dev/null
        echo "objectstore: made bucket $bucket"
    fi
done
touch "$READY"
echo "objectstore: ready on :8333 (buckets: $BUCKETS)"

# A trapped signal ends `wait` early: wait again until the server itself has exited, and exit with its status.
status=0
while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" || status=$?
done
exit "$status"
