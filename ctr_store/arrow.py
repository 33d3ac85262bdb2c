"""The same store as pyarrow's S3 filesystem: what training reads its `--data s3://...` through, streamed.

The endpoint, region and timeouts come from the one `StoreConfig` every stage uses; the credentials are the AWS
C++ SDK's own chain, which reads what boto3 reads (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`, a pod role's `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`, a shared profile, the
instance's metadata). pyarrow is imported on first use, so a serving process never loads it.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from ctr_store.config import StoreConfig
from ctr_store.errors import DENIED, NO_CREDENTIALS, NOT_FOUND, TIMEOUT, UNREACHABLE, StoreError
from ctr_store.url import BucketPath

# Words of the AWS C++ SDK's error text (pyarrow puts it in its OSError) for each reason an operator acts on.
_ARROW_REASONS = (
    (
        DENIED,
        ("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY_ID", "EXPIRED_TOKEN", "HTTP 403"),
    ),
    (NO_CREDENTIALS, ("NO_CREDENTIALS", "no credentials", "MISSING_AUTHENTICATION_TOKEN")),
    (TIMEOUT, ("REQUEST_TIMEOUT", "Timeout was reached", "curlCode: 28")),
    (
        UNREACHABLE,
        ("NETWORK_CONNECTION", "Couldn't connect", "curlCode: 7", "curlCode: 6", "Connection refused"),
    ),
)


def s3_filesystem(config: StoreConfig | None = None) -> Any:
    """A `pyarrow.fs.S3FileSystem` for the store `config` describes (default: `StoreConfig.from_env()`);
    its credentials come from this process's environment, as the module docstring says.

    Raises:
        ValueError: S3_VERIFY_SSL=0 with an https endpoint: pyarrow's client always checks certificates.
    """
    from pyarrow import fs

    config = config or StoreConfig.from_env()
    args: dict[str, Any] = {
        "region": config.region,
        "connect_timeout": config.connect_timeout_s,
        "request_timeout": config.read_timeout_s,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=config.max_attempts),
    }
    if config.endpoint_url:
        url = urlsplit(config.endpoint_url)
        args |= {"scheme": url.scheme or "https", "endpoint_override": url.netloc}
    https = args.get("scheme", "https") == "https"
    if https and not config.verify:
        raise ValueError(
            f"S3_VERIFY_SSL=0 with the https endpoint {config.endpoint_url or 'of AWS'}: pyarrow's S3 client "
            "always checks certificates; give the store's CA bundle as AWS_CA_BUNDLE instead"
        )
    if os.environ.get("AWS_CA_BUNDLE"):
        args["tls_ca_file_path"] = os.environ["AWS_CA_BUNDLE"]
    return fs.S3FileSystem(**args)


def arrow_path(path: BucketPath) -> str:
    """The path pyarrow's S3 filesystem names an object or prefix by: `bucket/key`."""
    return f"{path.bucket}/{path.prefix}" if path.prefix else path.bucket


def classify_arrow(exc: BaseException, what: str) -> StoreError:
    """An error pyarrow's S3 filesystem raised as a StoreError; `what` names the call and its object."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return StoreError(NOT_FOUND, f"{what}: not found")
    text = str(exc)
    for reason, words in _ARROW_REASONS:
        if any(w in text for w in words):
            fix = {
                DENIED: "; check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, the role) and the policy",
                NO_CREDENTIALS: "; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a pod role's "
                "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN",
                TIMEOUT: "",
                UNREACHABLE: "; check AWS_ENDPOINT_URL and that the store is up",
            }[reason]
            return StoreError(reason, f"{what}: {reason.replace('_', ' ')} ({_first_line(text)}){fix}")
    return StoreError("error", f"{what}: {_first_line(text)}")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no detail"
