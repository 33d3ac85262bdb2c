"""A small Markdown reader for the tests: `## ` sections and the GFM tables in each."""

from __future__ import annotations


def read_sections(text: str) -> dict[str, list[str]]:
    """Heading text of each `## ` section -> its lines."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def read_tables(lines: list[str]) -> list[list[dict[str, str]]]:
    """Every table in `lines` as a list of {header: cell} rows; raises on a ragged row."""
    tables: list[list[dict[str, str]]] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _cells(lines[i])
                if len(cells) != len(header):
                    raise ValueError(f"row has {len(cells)} cells, header {len(header)}: {lines[i]}")
                rows.append(dict(zip(header, cells, strict=True)))
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]
