"""`--model_version_policy`: TF Serving's latest/all/specific policies, parsed and applied to versions on disk."""

from __future__ import annotations

import pytest

from serving.repository.policy import VersionPolicy

ON_DISK = [7, 1, 12, 3]


@pytest.mark.parametrize(
    ("text", "policy", "served"),
    [
        ("latest", VersionPolicy("latest", 1), [12]),
        ("latest:1", VersionPolicy("latest", 1), [12]),
        ("latest:2", VersionPolicy("latest", 2), [7, 12]),
        ("latest:10", VersionPolicy("latest", 10), [1, 3, 7, 12]),  # more than there are: all of them
        ("all", VersionPolicy("all"), [1, 3, 7, 12]),
        ("specific:3,1", VersionPolicy("specific", versions=(1, 3)), [1, 3]),
        ("specific:3,5", VersionPolicy("specific", versions=(3, 5)), [3]),  # 5 is not on disk (yet)
        (" specific: 12 ", VersionPolicy("specific", versions=(12,)), [12]),
    ],
)
def test_policy_parses_and_selects(text: str, policy: VersionPolicy, served: list[int]) -> None:
    assert VersionPolicy.parse(text) == policy
    assert policy.select(ON_DISK) == served


def test_policies_select_nothing_from_an_empty_base_path() -> None:
    for text in ("latest:2", "all", "specific:1"):
        assert VersionPolicy.parse(text).select([]) == []


@pytest.mark.parametrize(
    "text",
    ["", "newest", "latest:0", "latest:1,2", "latest:x", "all:1", "specific", "specific:", "specific:1,,2"],
)
def test_bad_policies_name_the_expected_forms(text: str) -> None:
    message = f"bad version policy {text!r}; expected latest:N (N>=1), all, or specific:V1,V2,..."
    with pytest.raises(ValueError) as caught:
        VersionPolicy.parse(text)
    assert str(caught.value) == message
