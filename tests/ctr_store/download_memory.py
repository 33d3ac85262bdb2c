"""Peak memory of one version's download: `python -m tests.ctr_store.download_memory BUCKET PREFIX VERSION DEST`.

Prints the peak resident set growth in KiB over the download alone (/proc/self/statm sampled every 5 ms against
the resident set just before): the client is made and the prefixes listed first, so the figure is what the
bytes cost, not boto3's import.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import download_version, list_versions


def main() -> None:
    bucket, prefix, version, dest = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    store, base = ObjectStore(), BucketPath(bucket, prefix)
    list_versions(store, base)  # the client, its connection pool and the listing parser warm
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    before, peak, done = resident_kib(page_kib), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], resident_kib(page_kib))

    sampler = threading.Thread(target=sample)
    sampler.start()
    download_version(store, base, version, dest)
    done.set()
    sampler.join()
    print(max(peak[0], resident_kib(page_kib)) - before)


def resident_kib(page_kib: int) -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page_kib


if __name__ == "__main__":
    main()
