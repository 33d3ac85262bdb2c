"""Print the requirement lines of pyproject.toml's base dependencies plus the given extras.

The images install these before the source is copied, so a code change does not reinstall dependencies.
Runs on a bare Python 3.11 (stdlib only): `python pyproject_requirements.py pyproject.toml serve`.
"""

import sys
import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    """Return the base dependencies plus those of each extra, in order and without duplicates.

    Args:
        pyproject: path to pyproject.toml.
        extras: names under [project.optional-dependencies].

    Returns:
        PEP 508 requirement strings.
    """
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    known = project.get("optional-dependencies", {})
    lines = list(project.get("dependencies", []))
    for extra in extras:
        if extra not in known:
            raise SystemExit(f"unknown extra {extra!r}; pyproject.toml defines {sorted(known)}")
        lines += known[extra]
    return list(dict.fromkeys(lines))


def main() -> None:
    """Parse `PYPROJECT EXTRA...` and print one requirement per line."""
    if len(sys.argv) < 2:
        raise SystemExit("usage: pyproject_requirements.py PYPROJECT [EXTRA ...]")
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))


if __name__ == "__main__":
    main()
