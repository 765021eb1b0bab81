"""The one escape helper for client text in logs, labels and terminals."""

from __future__ import annotations

import json

import pytest

from bcs_middleware.core.printable import escape, json_line


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("plain /api/v1/pods?x=1", "plain /api/v1/pods?x=1", id="printable-unchanged"),
    pytest.param("名字 ünïcode", "名字 ünïcode", id="letters-unchanged"),
    pytest.param("a\nb\r\tc", "a\\x0ab\\x0d\\x09c", id="line-breaks"),
    pytest.param("\x1b[31mred\x07", "\\x1b[31mred\\x07", id="terminal-escape"),
    pytest.param("\x00\x7f\x9b", "\\x00\\x7f\\x9b", id="nul-del-c1"),
    pytest.param("a\u2028b\u202ec", "a\\u2028b\\u202ec", id="separator-and-bidi"),
    pytest.param("\U000e0001", "\\U000e0001", id="tag-character"),
    pytest.param(42, "42", id="not-a-string"),
])
def test_escape(text: object, expected: str) -> None:
    assert escape(text) == expected
    assert escape(expected) == expected  # escaping twice changes nothing


def test_json_line_leaves_no_control_character_raw() -> None:
    document = {"path": "/x\n\x1b\x7f\x9b\u2028\u202e名"}
    line = json_line(document)
    assert line.isascii() and line.isprintable() and "\n" not in line
    assert json.loads(line) == document
