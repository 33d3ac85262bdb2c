"""The store's faults as one typed error with a low-cardinality `reason` (a metric label) and a safe message.

No message carries a credential: botocore's never do, and `redact` removes any value of the secret variables
that a store's own error text might echo back.
"""

from __future__ import annotations

import os

# A reason per fault an operator acts on differently.
UNREACHABLE = "unreachable"  # no connection: DNS, refused, reset
TIMEOUT = "timeout"  # connected, but no answer within the deadline
DENIED = "denied"  # wrong or expired credentials, or no permission
NO_CREDENTIALS = "no_credentials"  # nothing in the credential chain
NO_BUCKET = "no_bucket"
NOT_FOUND = "not_found"
PRECONDITION = "precondition"  # a conditional write lost: the object exists
THROTTLED = "throttled"
HASH_MISMATCH = "hash_mismatch"  # an object's bytes differ from its manifest
ERROR = "error"  # anything else the store answered
REASONS = (UNREACHABLE, TIMEOUT, DENIED, NO_CREDENTIALS, NO_BUCKET, NOT_FOUND, PRECONDITION, THROTTLED)

DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "403",
    }
)
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


class StoreError(Exception):
    """A call to the object store failed; `reason` is one of the names above."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(redact(message))
        self.reason = reason


def redact(text: str) -> str:
    for name in SECRET_VARIABLES:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def classify(exc: BaseException, what: str) -> StoreError:
    """`exc` from boto3 as a StoreError; `what` names the call and its object, e.g. "GET s3://m/ctr/3/x"."""
    from botocore import exceptions as bx

    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return StoreError(TIMEOUT, f"{what}: the store did not answer in time ({exc})")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectionClosedError | bx.ConnectionError):
        return StoreError(UNREACHABLE, f"{what}: cannot reach the store ({exc})")
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return StoreError(
            NO_CREDENTIALS,
            f"{what}: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a pod role's "
            "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN)",
        )
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        detail = f"{code or status}: {err.get('Message') or exc}"
        if code in DENIED_CODES or status == 403:
            return StoreError(DENIED, f"{what}: access denied ({detail}); check the credentials and policy")
        if code == "NoSuchBucket":
            return StoreError(NO_BUCKET, f"{what}: no such bucket ({detail})")
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return StoreError(NOT_FOUND, f"{what}: not found")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return StoreError(PRECONDITION, f"{what}: the object already exists ({detail})")
        if code in ("SlowDown", "Throttling", "ServiceUnavailable") or status == 503:
            return StoreError(THROTTLED, f"{what}: the store is throttling ({detail})")
        return StoreError(ERROR, f"{what}: {detail}")
    if isinstance(exc, bx.BotoCoreError | OSError):
        return StoreError(UNREACHABLE, f"{what}: {exc}")
    return StoreError(ERROR, f"{what}: {type(exc).__name__}: {exc}")
