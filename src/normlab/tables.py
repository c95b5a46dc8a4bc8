"""Markdown tables: the one helper behind the sweep summary, the reproductions' md and the bench."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(value: object) -> str:
    """Text safe inside a markdown table cell (a norm's bars |x| would split the row)."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(
    columns: Sequence[object], rows: Iterable[Sequence[object]], width: int | None = None
) -> str:
    """A markdown table: a header row of `columns`, then a row per sequence of cells, each made
    safe by `cell` and cut to `width` characters when given; no newline at the end."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(cell(c)[:width] for c in cells) + " |"

    return "\n".join([line(columns), "|" + "---|" * len(columns), *map(line, rows)])
