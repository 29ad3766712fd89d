"""Plain-text tables that fit a terminal: the one formatter the ``warren`` command, ``warren
store inspect`` and the benchmarks print with.

``format_table(columns, rows, width=80)`` lays the rows out under a header and a rule, two
spaces between columns. Each ``Column`` is left- or right-aligned; a column marked
``wrap`` may be narrowed, its cells wrapped onto continuation lines, when the table would be
wider than ``width``, and one marked ``cut`` likewise, its cells cut short with an ellipsis
(a name keeps one line per row). Such columns give up width in proportion to their natural
width, never below ``min_width``; a table that still does not fit (too many fixed columns)
is left wider rather than cutting a figure. Cells are strings: callers format their
numbers (``abbreviated`` keeps a big count short), so a figure is never rounded here
behind their back.

Widths are what a terminal shows, not characters: a wide character (CJK, most emoji:
East Asian Width W or F) takes two columns and a combining mark none, so a queue named
in Japanese keeps the columns after it aligned, and is cut or wrapped by what it shows.
"""

from __future__ import annotations

import json
import math
import textwrap
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TERMINAL_COLUMNS = 80
_GAP = "  "


@dataclass(frozen=True)
class Column:
    """One column: its header, alignment (``"<"`` or ``">"``), and whether it may be
    narrowed: its cells wrapped (``wrap``) or cut with an ellipsis (``cut``)."""

    name: str
    align: str = "<"
    wrap: bool = False
    min_width: int = 12
    cut: bool = False

    def __post_init__(self) -> None:
        if self.align not in ("<", ">"):
            raise ValueError(f"align must be '<' or '>', got {self.align!r}")
        if self.wrap and self.cut:
            raise ValueError("a column either wraps or cuts its cells, not both")

    @property
    def narrows(self) -> bool:
        return self.wrap or self.cut


def format_table(
    columns: Sequence[Column], rows: Iterable[Sequence[str]], *, width: int = TERMINAL_COLUMNS
) -> str:
    """The rows under a header line and a rule, fitting ``width`` columns when possible."""
    rows = [list(row) for row in rows]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns: {row!r}")
    widths = [
        max([shown_width(c.name), *(shown_width(row[i]) for row in rows)])
        for i, c in enumerate(columns)
    ]
    widths = _fit(columns, widths, width)
    lines = [_join(columns, widths, [c.name for c in columns]), _GAP.join("-" * w for w in widths)]
    for row in rows:
        cells = [_fitted(c, cell, w) for c, cell, w in zip(columns, row, widths, strict=True)]
        for depth in range(max(len(parts) for parts in cells)):
            lines.append(
                _join(
                    columns, widths, [parts[depth] if depth < len(parts) else "" for parts in cells]
                )
            )
    return "\n".join(lines)


def shown_width(text: str) -> int:
    """The columns ``text`` takes on a terminal: 2 for a wide character, 0 for a
    combining one, 1 for the others."""
    return sum(_char_width(char) for char in text)


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def _cut(text: str, width: int) -> tuple[str, str]:
    """``text`` split where its first part takes at most ``width`` columns."""
    taken = 0
    for index, char in enumerate(text):
        taken += _char_width(char)
        if taken > width:
            return text[:index], text[index:]
    return text, ""


def _fitted(column: Column, cell: str, width: int) -> list[str]:
    """The lines of one cell in a column ``width`` wide."""
    if shown_width(cell) <= width or not column.narrows:
        return [cell]
    if column.cut:
        return [_cut(cell, width - 1)[0] + "…"]
    lines = []
    for line in textwrap.wrap(cell, width, break_on_hyphens=False) or [""]:
        while shown_width(line) > width:  # wide characters: textwrap counts characters
            part, line = _cut(line, width)
            lines.append(part)
        lines.append(line)
    return lines


def _fit(columns: Sequence[Column], widths: list[int], width: int) -> list[int]:
    """Narrow the wrapping and cutting columns, in proportion to their width, until the
    table fits."""
    excess = sum(widths) + len(_GAP) * (len(widths) - 1) - width
    wrapping = [i for i, c in enumerate(columns) if c.narrows and widths[i] > c.min_width]
    if excess <= 0 or not wrapping:
        return widths
    room = sum(widths[i] - columns[i].min_width for i in wrapping)
    fitted = list(widths)
    for i in wrapping:
        share = (widths[i] - columns[i].min_width) * min(1.0, excess / room)
        fitted[i] = widths[i] - int(share + 0.999)
    return fitted


def _join(columns: Sequence[Column], widths: list[int], cells: list[str]) -> str:
    return _GAP.join(
        f"{cell:{c.align}{w - shown_width(cell) + len(cell)}}"
        for c, cell, w in zip(columns, cells, widths, strict=True)
    ).rstrip()


__all__ = ["Column", "TERMINAL_COLUMNS", "abbreviated", "counted", "format_table", "strict_json"]

_SCALES = ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k"))


def abbreviated(count: int, unit: str = "") -> str:
    """A count in at most 5 characters and its unit: ``"9,999"``, then ``"12k"``,
    ``"1.2M"``, ``"45G"`` (decimal, as ``ls -h --si`` and RabbitMQ's management page show
    them); ``abbreviated(n, "B")`` for bytes: ``"512B"``, ``"3.1MB"``."""
    if abs(count) < (1000 if unit else 10_000):
        return f"{count:,}{unit}"
    for scale, prefix in _SCALES:
        if abs(count) >= scale:
            value = count / scale
            text = f"{value:.1f}" if abs(value) < 9.95 else f"{value:.0f}"
            return f"{text}{prefix}{unit}"
    return f"{count:,}{unit}"


def counted(count: int, noun: str) -> str:
    """``"1 message"``, ``"2,000 messages"``: a count and its noun, singular or plural."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def strict_json(value: object) -> str:
    """``value`` as strict JSON, indented: a float that JSON cannot hold (an infinite RAM
    target, a rate over no time) becomes null, so every parser reads the output."""
    return json.dumps(_finite(value), indent=2, allow_nan=False, default=str)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
