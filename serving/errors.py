"""The server's typed errors. Each maps to TF Serving's HTTP status and gRPC code in one place.

REST bodies are always `{"error": "<message>"}`; gRPC aborts with the matching status code.
The `code` string is TF Serving's error-code name, used as the `status` label of the request counter.
"""

from __future__ import annotations

import json
import time

import grpc

JSON = b"application/json"  # the content type of every REST answer but the metrics page


def error_body(message: str) -> bytes:
    """The REST body of an error: `{"error": "<message>"}`, as TF Serving writes it."""
    return json.dumps({"error": message}).encode()


class ServingError(Exception):
    """Base class: a request failed for a reason the client should see."""

    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL
    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ServingError):
    """The request is malformed or its values are out of contract (400)."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    code = "INVALID_ARGUMENT"


class NotFound(ServingError):
    """Unknown model, version, label or route (404)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND
    code = "NOT_FOUND"


class MethodNotAllowed(ServingError):
    """A known route called with the wrong HTTP method (405)."""

    http_status = 405
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    code = "UNIMPLEMENTED"

    def __init__(self, message: str, allow: str) -> None:
        """`allow`: the methods the route takes, for the 405's `Allow` header (RFC 9110)."""
        super().__init__(message)
        self.allow = allow


class Unimplemented(ServingError):
    """An API TF Serving has that this server does not serve, e.g. :classify (501)."""

    http_status = 501
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    code = "UNIMPLEMENTED"


class Overloaded(ServingError):
    """The batching queue is full; the client should back off and retry (429)."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    code = "RESOURCE_EXHAUSTED"


class Unavailable(ServingError):
    """No version is loaded yet, or the server is shutting down (503)."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
    code = "UNAVAILABLE"


class DeadlineExceeded(ServingError):
    """The request's deadline passed (504, gRPC DEADLINE_EXCEEDED): it waited in the batching queue longer than
    `--rest_api_timeout_in_ms`, or its own deadline (a gRPC deadline, REST's `x-request-timeout-ms`) passed
    before its work started or before the model answered (serving/routing/fallback.py)."""

    http_status = 504
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    code = "DEADLINE_EXCEEDED"


class DeadlinePassed(DeadlineExceeded):
    """The request's deadline passed before the work started: nothing ran, no version is blamed."""


def check_deadline(deadline: float | None, when: str) -> None:
    """Raise DeadlinePassed when `deadline` (time.monotonic() seconds; None: none) has passed; `when`: what
    was about to start, for the message."""
    if deadline is not None:
        late = time.monotonic() - deadline
        if late >= 0:
            raise DeadlinePassed(
                f"the request's deadline passed {late * 1e3:.0f} ms before {when}, so it was not run "
                "(gRPC deadline or x-request-timeout-ms); retry with a longer deadline"
            )


class NonFiniteOutput(ServingError):
    """The model returned NaN or Inf for an instance the API accepted (500, gRPC INTERNAL).

    Not a client mistake: the input passed every check, so the server failed (serving/dataplane/output_check.py).
    """


class ModelLoadError(Exception):
    """A model version could not be loaded or warmed; the server keeps serving the previous one."""
