"""CEL's string extension (cel-go ``ext.Strings``, version 2, which kube-apiserver's environment
includes), with every result bounded.

cel-cpp has the extension too, but its ``replace`` grows a string without limit:
``claims.s.replace('', claims.s)`` squares the input, and a chain of ``replace('a', 'aa')``
doubles it each time — a file's expression could take a worker's memory on one token. Here each
function is the extension's (same names, overloads and semantics: indices count code points, as
cel-go's runes) and a result longer than :data:`MAX_STRING` characters is an evaluation error, so
an evaluation's strings never outgrow what a token could carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cel_expr_python import cel

__all__ = ["DECLARATIONS", "MAX_STRING"]

#: The longest string a function returns (a token's claims are at most 64 KiB).
MAX_STRING = 64 * 1024


def _char_at(text: str, index: int) -> str:
    if index < 0 or index > len(text):
        raise ValueError(f"index out of range: {index}")
    return text[index:index + 1]


def _index_of(text: str, sub: str, start: int = 0) -> int:
    if start < 0 or start > len(text):
        raise ValueError(f"index out of range: {start}")
    return text.find(sub, start)


def _last_index_of(text: str, sub: str, start: int | None = None) -> int:
    if start is None:
        return text.rfind(sub)
    if start < 0 or start > len(text):
        raise ValueError(f"index out of range: {start}")
    return text.rfind(sub, 0, start + len(sub))


def _replace(text: str, old: str, new: str, count: int = -1) -> str:
    # The result's length is known before it is built: never allocate past the bound.
    occurrences = len(text) + 1 if old == "" else text.count(old)
    if count >= 0:
        occurrences = min(occurrences, count)
    if len(text) + occurrences * (len(new) - len(old)) > MAX_STRING:
        raise ValueError(f"string result longer than {MAX_STRING} characters")
    return text.replace(old, new, count)


def _split(text: str, separator: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    if separator == "":
        parts = list(text)
        if 0 < limit < len(parts):
            parts = [*parts[:limit - 1], "".join(parts[limit - 1:])]
        return parts
    return text.split(separator, limit - 1) if limit > 0 else text.split(separator)


def _substring(text: str, start: int, end: int | None = None) -> str:
    end = len(text) if end is None else end
    if start < 0 or start > len(text) or end < start or end > len(text):
        raise ValueError(f"index out of range: {start}, {end}")
    return text[start:end]


def _join(items: list[Any], separator: str = "") -> str:
    if not all(isinstance(item, str) for item in items):
        raise ValueError("join: a list of strings only")
    if sum(map(len, items)) + len(separator) * max(len(items) - 1, 0) > MAX_STRING:
        raise ValueError(f"string result longer than {MAX_STRING} characters")
    return separator.join(items)


def _ascii(convert: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: "".join(convert(c) if c.isascii() else c for c in text)


def _declarations() -> list[Any]:
    text, number = cel.Type.STRING, cel.Type.INT
    texts = cel.Type.List(text)

    def member(name: str, result: Any, params: list[Any], impl: Callable[..., Any], suffix: str = "") -> Any:
        return cel.Overload(f"bcs_{name}{suffix}", result, params, is_member=True, impl=impl)

    return [
        cel.FunctionDecl("charAt", [member("charAt", text, [text, number], _char_at)]),
        cel.FunctionDecl("indexOf", [member("indexOf", number, [text, text], _index_of),
                                     member("indexOf", number, [text, text, number], _index_of, "_int")]),
        cel.FunctionDecl("lastIndexOf", [member("lastIndexOf", number, [text, text], _last_index_of),
                                         member("lastIndexOf", number, [text, text, number], _last_index_of, "_int")]),
        cel.FunctionDecl("lowerAscii", [member("lowerAscii", text, [text], _ascii(str.lower))]),
        cel.FunctionDecl("upperAscii", [member("upperAscii", text, [text], _ascii(str.upper))]),
        cel.FunctionDecl("replace", [member("replace", text, [text, text, text], _replace),
                                     member("replace", text, [text, text, text, number], _replace, "_int")]),
        cel.FunctionDecl("split", [member("split", texts, [text, text], _split),
                                   member("split", texts, [text, text, number], _split, "_int")]),
        cel.FunctionDecl("substring", [member("substring", text, [text, number], _substring),
                                       member("substring", text, [text, number, number], _substring, "_int_int")]),
        cel.FunctionDecl("trim", [member("trim", text, [text], str.strip)]),
        cel.FunctionDecl("join", [member("join", text, [texts], _join),
                                  member("join", text, [texts, text], _join, "_string")]),
    ]


#: The declarations :mod:`.cel` gives its environments.
DECLARATIONS = _declarations()
