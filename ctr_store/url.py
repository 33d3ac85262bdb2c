"""`s3://BUCKET/PREFIX`: the one parser of an object-store path, for every stage."""

from __future__ import annotations

from dataclasses import dataclass

SCHEME = "s3://"


def is_bucket_path(path: object) -> bool:
    """True when `path` (a str, or anything whose str() is the path) names an object-store location."""
    return str(path).startswith(SCHEME)


@dataclass(frozen=True)
class BucketPath:
    """A bucket and a key prefix without leading or trailing slashes ("" for the bucket's root)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> BucketPath:
        """`s3://models/prod/ctr/` -> BucketPath("models", "prod/ctr"); ValueError names what is wrong."""
        if not url.startswith(SCHEME):
            raise ValueError(f"{url!r} is not an s3:// path (expected s3://BUCKET/PREFIX)")
        bucket, _, prefix = url[len(SCHEME) :].partition("/")
        if not bucket:
            raise ValueError(f"{url!r} names no bucket (expected s3://BUCKET/PREFIX)")
        prefix = prefix.strip("/")
        if "//" in prefix:
            raise ValueError(f"{url!r} has an empty path segment")
        return cls(bucket, prefix)

    def key(self, *parts: str) -> str:
        """The object key of `parts` under the prefix: key("3", "model.onnx") -> "prod/ctr/3/model.onnx"."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def child(self, *parts: str) -> BucketPath:
        return BucketPath(self.bucket, self.key(*parts))

    @property
    def name(self) -> str:
        """The last segment of the prefix (a model's name, as a local base path's folder name)."""
        return self.prefix.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"
