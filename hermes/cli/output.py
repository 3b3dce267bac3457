"""What the commands print through: the two consoles and the one table renderer.

Every table of the CLI (sessions, approvals, tools, MCP servers, memories, a session's
trace) is drawn by :func:`print_table`, and every key/value block (``hermes show``'s
header, ``hermes dev``'s banner) by :func:`print_fields`, so they look alike and a
change of style is made once. Cell text is the caller's to escape: a value from a user,
a model or a server goes through :func:`rich.markup.escape` before it reaches a cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console, RenderableType
from rich.table import Table

__all__ = ["Column", "err_console", "out", "print_fields", "print_table"]

out = Console(highlight=False)
"""Standard output: replies, tables, banners."""

err_console = Console(stderr=True, highlight=False)
"""Standard error: progress, tool-call notices, inline errors of ``hermes chat``."""


@dataclass(frozen=True)
class Column:
    """One column of a :func:`print_table` table.

    ``overflow`` is rich's: "fold" wraps a long id onto the next line (nothing is cut),
    "ellipsis" cuts it with ``…``.
    """

    header: str
    overflow: Literal["fold", "crop", "ellipsis", "ignore"] = "fold"
    justify: Literal["left", "center", "right"] = "left"
    no_wrap: bool = False


def print_table(
    columns: Sequence[Column | str],
    rows: Iterable[Sequence[RenderableType]],
    *,
    title: str | None = None,
    console: Console | None = None,
) -> None:
    """Print one table.

    Args:
        columns: a :class:`Column`, or a header (a folding, left-justified column).
        rows: cells in column order, already escaped for rich markup.
        title: shown above, left-justified; None: no title.
        console: where to print; :data:`out` by default.

    Raises:
        rich.errors.NotRenderableError: a cell that rich cannot render.
    """
    table = Table(title=title, title_justify="left")
    for column in columns:
        spec = column if isinstance(column, Column) else Column(column)
        table.add_column(spec.header, overflow=spec.overflow, justify=spec.justify, no_wrap=spec.no_wrap)
    for row in rows:
        table.add_row(*row)
    (console or out).print(table)


def print_fields(fields: Iterable[tuple[str, RenderableType]], *, console: Console | None = None) -> None:
    """Print ``name  value`` lines with the names in bold and the values aligned.

    Args:
        fields: (name, value) pairs, in order; values already escaped for rich markup.
        console: where to print; :data:`out` by default.
    """
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for name, value in fields:
        grid.add_row(name, value)
    (console or out).print(grid)
