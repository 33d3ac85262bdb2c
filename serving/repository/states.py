"""The status table of a model's versions, and its rules: wait for an incomplete folder, fail one version alone.

A failure is remembered with the stamp of the files that failed (serving/repository/manifest_check.py), so the version is
retried as soon as one of its files changes, and only then. Each failure is logged once and counted by reason
in `ctr_serving_versions_rejected_total`.
"""

from __future__ import annotations

import errno
import logging
import math
import time
from dataclasses import dataclass, field

from serving.observability.metrics import ServingMetrics
from serving.repository.manifest_check import HashMismatch, Stamp, VersionNotReady, VersionRejected

log = logging.getLogger("serving.repository.manager")
MAX_GONE_STATES = 16  # statuses kept for versions no longer on disk (the newest ones)
CONTENT_RECHECK_S = 60.0  # how often a failed version's bytes are hashed again (its stat stamp: every poll)
ERRNO_CODES = {errno.EACCES: "PERMISSION_DENIED", errno.EPERM: "PERMISSION_DENIED", errno.ENOENT: "NOT_FOUND"}


@dataclass
class VersionState:
    """What the status endpoint reports for one version (TF Serving's ModelVersionStatus)."""

    version: int
    state: str = "START"  # START (also: waiting for a complete folder), LOADING, AVAILABLE, UNLOADING, END
    error_code: str = "OK"
    error_message: str = ""
    failed_stamp: Stamp | str | None = field(default=None, repr=False)  # the files (or OS error) that failed
    last_stamp: Stamp | str | None = field(default=None, repr=False)  # the files the last attempt saw
    waiting_since: float | None = field(default=None, repr=False)  # monotonic time it was first incomplete
    failed_digest: str | None = field(default=None, repr=False)  # content_digest of the files that failed
    digest_checked: float = field(default=0.0, repr=False)  # monotonic time of the last content check


class VersionStates(dict[int, VersionState]):
    """version -> VersionState, plus the transitions that are not a plain load."""

    def __init__(self, model_name: str, metrics: ServingMetrics, manifest_wait_s: float) -> None:
        super().__init__()
        self.model_name, self.metrics, self.manifest_wait_s = model_name, metrics, manifest_wait_s

    def failed(self) -> set[int]:
        """Versions whose failure waits for a change of their files."""
        return {v for v, s in self.items() if s.failed_stamp is not None}

    def due_for_content_check(self) -> frozenset[int]:
        """Failed versions whose bytes were last hashed CONTENT_RECHECK_S ago or more (marked checked now)."""
        now = time.monotonic()
        due = frozenset(
            v
            for v, s in self.items()
            if s.failed_stamp is not None and now - s.digest_checked >= CONTENT_RECHECK_S
        )
        for v in due:
            self[v].digest_checked = now
        return due

    def still_failed(self, version: int, current: Stamp | str | None, digest: str | None = None) -> bool:
        """True while a failed version's files are unchanged; a change clears the failure (retry it).

        Args:
            current: the files' stamp now (size, mtime, ctime, inode), or their OS error; None: not stamped.
            digest: their content_digest now, when this scan hashed them; None: not hashed this time.
        """
        state = self.get(version)
        if state is None or state.failed_stamp is None:
            return False
        changed = current is not None and current != state.failed_stamp
        if not changed and digest is not None:
            if (
                state.failed_digest is None
            ):  # its files could not be hashed when it failed: this is the first look
                state.failed_digest = digest
            changed = digest != state.failed_digest
        if not changed:
            return True
        log.info("%s version %d changed since it failed; retrying it", self.model_name, version)
        state.failed_stamp = state.failed_digest = None
        return False

    def entry_error(self, version: int, error: str) -> None:
        """The version's folder entry itself cannot be read (e.g. a looping symlink named `7`)."""
        state = self.setdefault(version, VersionState(version))
        if state.failed_stamp != error:
            self.fail(state, "os_error", errno_code(error), f"cannot read the folder: {error}", error)

    def settle_failure(
        self, state: VersionState, exc: Exception | None, stamp: Stamp | str | None, digest: str | None = None
    ) -> None:
        """Sort a failed attempt: not ready (wait), or rejected by reason; a hash mismatch is final when still."""
        stamp = stamp or "unreadable"
        if isinstance(exc, HashMismatch) and stamp != state.last_stamp:
            # The files changed since the last look: a copy may still be writing this file. Judge it when still.
            self.not_ready(state, f"{exc} (checking again, it may still be being written)", stamp)
        elif isinstance(exc, VersionNotReady):
            self.not_ready(state, str(exc), stamp)
        elif isinstance(exc, HashMismatch):
            self.fail(state, exc.reason, "DATA_LOSS", str(exc), stamp, digest)
        elif isinstance(exc, VersionRejected):
            self.fail(state, exc.reason, "FAILED_PRECONDITION", str(exc), stamp, digest)
        elif isinstance(exc, OSError):
            code = ERRNO_CODES.get(exc.errno or 0, "FAILED_PRECONDITION")
            self.fail(state, "os_error", code, str(exc), stamp, digest)
        else:
            self.metrics.load_failures.inc(self.model_name)
            self.fail(state, "load_error", "UNKNOWN", str(exc), stamp, digest)

    def not_ready(self, state: VersionState, detail: str, stamp: Stamp | str) -> None:
        """An incomplete folder: wait without counting a failure, up to --manifest_wait_timeout_seconds."""
        now = time.monotonic()
        if state.waiting_since is None:
            state.waiting_since = now
            log.info(
                "%s version %d is not ready yet: %s; waiting up to %gs (--manifest_wait_timeout_seconds)",
                self.model_name,
                state.version,
                detail,
                self.manifest_wait_s,
            )
        elif self.manifest_wait_s and now - state.waiting_since >= self.manifest_wait_s:
            waited = f"still incomplete after {self.manifest_wait_s:g}s (--manifest_wait_timeout_seconds)"
            self.fail(state, "not_ready", "DEADLINE_EXCEEDED", f"{waited}: {detail}", stamp)
            return
        state.state, state.error_code = "START", "OK"
        state.error_message, state.last_stamp = f"not ready yet: {detail}", stamp

    def fail(
        self,
        state: VersionState,
        reason: str,
        code: str,
        detail: str,
        stamp: Stamp | str,
        digest: str | None = None,
    ) -> None:
        """Mark the version failed until its files change: one log line, one count under `reason`."""
        state.state, state.error_code, state.failed_stamp = "END", code, stamp
        # A folder that hung a load, or gave an OS error, is never hashed on the scan thread: it could hang it too.
        hazardous = reason in ("load_timeout", "os_error")
        state.failed_digest, state.digest_checked = digest, math.inf if hazardous else time.monotonic()
        state.waiting_since = state.last_stamp = None
        state.error_message = (
            f"failed to load version {state.version}: {detail}"
            if reason == "load_error"
            else f"version {state.version} rejected ({reason}): {detail}"
        )
        self.metrics.versions_rejected.inc(self.model_name, reason)
        log.error("%s %s; previously loaded versions keep serving", self.model_name, state.error_message)

    def available(self, state: VersionState) -> None:
        state.state, state.error_code, state.error_message = "AVAILABLE", "OK", ""
        self.metrics.version_at_zero(self.model_name, state.version)  # its fallback counters, at 0
        state.waiting_since = state.last_stamp = None

    def forget_gone(self, present: set[int]) -> None:
        """Drop waiting versions whose folder vanished; keep only the newest MAX_GONE_STATES ended ones."""
        gone = sorted(v for v in self if v not in present)
        for v in gone:
            if self[v].state in ("START", "LOADING"):
                del self[v]
            elif self[v].state == "END":
                self[v].failed_stamp = self[v].failed_digest = (
                    None  # a new folder with this number: tried afresh
                )
        ended = [v for v in gone if v in self and self[v].state == "END"]
        for v in ended[:-MAX_GONE_STATES]:
            del self[v]


def errno_code(error_text: str) -> str:
    """TF's error code for an OS error text such as "[Errno 13] Permission denied: ..."."""
    for number, code in ERRNO_CODES.items():
        if error_text.startswith(f"[Errno {number}]"):
            return code
    return "FAILED_PRECONDITION"
