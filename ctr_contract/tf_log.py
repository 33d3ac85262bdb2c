"""TensorFlow's C++ log, one rule for every entrypoint: quiet unless the user asks for it.

TensorFlow prints INFO lines while its libraries load, and `E0000 ... failed call to cuInit` on every machine
without a GPU; a newcomer reads those as failures. So, unless asked (the entrypoint's `--verbose`, or the user's
own TF_CPP_MIN_LOG_LEVEL, which is left as it is), TF_CPP_MIN_LOG_LEVEL=3 is set before TensorFlow is imported.
absl writes its pre-init lines while the libraries load, before that level applies, so the import itself runs with
file descriptor 2 held back; what it caught is written out only when the import fails. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = "3"  # 3 hides ERROR too: the cuInit line is an ERROR on every CPU-only machine


def quiet_tensorflow_log(verbose: bool) -> bool:
    """Set TF_CPP_MIN_LOG_LEVEL=3 unless `verbose` or the user set it; returns whether the log is quieted."""
    if verbose or LOG_LEVEL_ENV in os.environ:
        return False
    os.environ[LOG_LEVEL_ENV] = QUIET_LEVEL
    return True


@contextlib.contextmanager
def _stderr_held_back() -> Iterator[None]:
    """Route file descriptor 2 into a temporary file; write what it caught to stderr only if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                caught.seek(0)
                sys.stderr.write(caught.read().decode(errors="replace"))
                sys.stderr.flush()


@contextlib.contextmanager
def quiet_tensorflow_import(verbose: bool = False) -> Iterator[None]:
    """Run the caller's `import tensorflow` under the rule above: its load-time lines are shown when `verbose`, or
    when the import fails; the contract itself never imports TensorFlow."""
    if quiet_tensorflow_log(verbose) and "tensorflow" not in sys.modules:
        with _stderr_held_back():
            yield
    else:
        yield
