"""The store's endpoint, TLS and timeouts, read from the environment as the AWS tools and TF Serving read them.

Credentials are boto3's own chain, untouched: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`, a pod role's `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`, a shared profile, the
instance's metadata. The endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, or TF Serving's `S3_ENDPOINT`
(a host and port; `S3_USE_HTTPS=0` for plain HTTP). `S3_VERIFY_SSL=0` turns certificate checks off.
Region: `AWS_REGION`, `AWS_DEFAULT_REGION`, else us-east-1 (what S3-compatible stores accept).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_REGION = "us-east-1"
FALSE_WORDS = ("0", "false", "no", "off")


@dataclass(frozen=True)
class StoreConfig:
    endpoint_url: str | None = None  # None: AWS's own endpoint for the region
    region: str = DEFAULT_REGION
    verify: bool = True
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_attempts: int = 3  # boto3's "standard" retries: throttling and 5xx, with backoff
    pool_size: int = 16  # connections kept: the parallel downloads of one version

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> StoreConfig:
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint is None and env.get("S3_ENDPOINT"):
            host = env["S3_ENDPOINT"]
            if "://" not in host:
                https = env.get("S3_USE_HTTPS", "1").strip().lower() not in FALSE_WORDS
                host = f"{'https' if https else 'http'}://{host}"
            endpoint = host
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
        verify = env.get("S3_VERIFY_SSL", "1").strip().lower() not in FALSE_WORDS
        return cls(endpoint, region, verify, **overrides)

    def client(self) -> Any:
        """A boto3 S3 client (thread-safe: one per process is enough). boto3 is imported here, on first use."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            verify=self.verify,
            config=Config(
                connect_timeout=self.connect_timeout_s,
                read_timeout=self.read_timeout_s,
                retries={"max_attempts": self.max_attempts, "mode": "standard"},
                max_pool_connections=self.pool_size,
                s3={"addressing_style": "path"} if self.endpoint_url else None,
            ),
        )

    def describe(self) -> str:
        """For logs: the endpoint and region, never a credential."""
        return f"endpoint {self.endpoint_url or 'aws'} region {self.region}"
