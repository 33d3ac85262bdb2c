"""Which versions to serve: TF Serving's `latest {num_versions}`, `all` and `specific {versions}` policies."""

from __future__ import annotations

from dataclasses import dataclass

from ctr_contract.repository import parse_version_dir


@dataclass(frozen=True)
class VersionPolicy:
    """A served-versions policy parsed from `--model_version_policy`."""

    kind: str  # "latest", "all" or "specific"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        """Parse `latest:N`, `latest`, `all` or `specific:1,3`; raise ValueError naming the expected forms."""
        kind, _, arg = text.strip().partition(":")
        error = ValueError(
            f"bad version policy {text!r}; expected latest:N (N>=1), all, or specific:V1,V2,..."
        )
        if kind == "all" and not arg:
            return cls("all")
        numbers = [p.strip() for p in arg.split(",")] if arg else []
        parsed = [parse_version_dir(p) for p in numbers]  # the version-folder rule: 1..2**63-1, canonical
        if None in parsed:
            raise error
        values = [v for v in parsed if v is not None]
        if kind == "latest" and len(values) <= 1:
            return cls("latest", num_versions=values[0] if values else 1)
        if kind == "specific" and values:
            return cls("specific", versions=tuple(sorted(values)))
        raise error

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of the loadable ones on disk."""
        if self.kind == "all":
            return sorted(available)
        if self.kind == "specific":
            return [v for v in self.versions if v in available]
        return sorted(available)[-self.num_versions :]
