"""How answers are printed: a table for people (default), or ``-o json`` / ``-o yaml`` for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from ...core.printable import escape

FORMATS = ("table", "json", "yaml")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return escape(json.dumps(value, sort_keys=True))
    return escape(value)  # the gateway's text, for a terminal: no escape sequence in it


def emit(data: Any, fmt: str, columns: Sequence[str] = (), *, out: TextIO | None = None) -> None:
    """Print ``data`` (a dict or a list of dicts); ``columns`` pick the table's columns."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return
    if fmt == "yaml":
        out.write(yaml.safe_dump(data, sort_keys=True))
        return
    if isinstance(data, dict):
        keys = list(columns) or list(data)
        width = max((len(k) for k in keys), default=0)
        for key in keys:
            out.write(f"{key.upper():<{width}}  {_cell(data.get(key))}\n")
        return
    rows = [dict(r) for r in data]
    keys = list(columns) or (list(rows[0]) if rows else [])
    table = [[k.upper() for k in keys]] + [[_cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(keys))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n")
