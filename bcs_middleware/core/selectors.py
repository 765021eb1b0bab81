"""Kubernetes label and field selector strings, checked as apimachinery parses them.

Pure functions, no imports beyond the standard library. :mod:`bcs_middleware.core.requestinfo`
needs them: a ``list``/``watch`` whose ``fieldSelector`` requires ``metadata.name=X`` is a
request for the object ``X`` — but only when the whole ``ListOptions`` decodes, and a label
selector that does not parse makes that decode fail. (Matching objects is the structured
selectors' job, :mod:`bcs_middleware.admission.definitions`.)

Ported from ``k8s.io/apimachinery/pkg/fields/selector.go`` (``ParseSelector``:
``splitTerms``, ``splitTerm``, ``UnescapeValue``, ``RequiresExactMatch``) and
``k8s.io/apimachinery/pkg/labels/selector.go`` (``Parse``: its byte lexer, parser and
``NewRequirement``'s checks, with ``validation.IsQualifiedName`` and
``IsValidLabelValue`` from ``k8s.io/apimachinery/pkg/util/validation``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["SelectorError", "field_selector_exact", "parse_label_selector"]


class SelectorError(ValueError):
    """The selector does not parse (the apiserver answers such a list with 400)."""


# -- field selectors (fields/selector.go) ------------------------------------------------

_FIELD_OPERATORS = ("!=", "==", "=")


def _split_terms(selector: str) -> list[str]:
    """Comma-separated terms; a backslash-escaped comma stays in its term (``splitTerms``)."""
    if not selector:
        return []
    terms, start, in_slash = [], 0, False
    for i, ch in enumerate(selector):
        if in_slash:
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == ",":
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    """The first operator splits (no escaping on the left-hand side, ``splitTerm``)."""
    for i in range(len(term)):
        for op in _FIELD_OPERATORS:
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
    return None


def _unescape_value(value: str) -> str:
    """``\\\\``, ``\\,`` and ``\\=`` unescaped; a bare ``,`` or ``=`` is an error (``UnescapeValue``)."""
    if not any(c in value for c in "\\,="):
        return value
    out: list[str] = []
    in_slash = False
    for ch in value:
        if in_slash:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch in ",=":
            raise SelectorError(f"invalid field selector: unescaped rune character in value: {ch}")
        else:
            out.append(ch)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def field_selector_exact(selector: str, field: str) -> str | None:
    """The value ``selector`` requires ``field`` to equal, ``None`` if none; :class:`SelectorError`
    when the selector does not parse (``ParseSelector`` then ``RequiresExactMatch``)."""
    found: str | None = None
    for part in sorted(_split_terms(selector)):  # Go sorts the terms; the first match wins
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise SelectorError(f"invalid selector: {selector!r}; can't understand {part!r}")
        lhs, op, rhs = split
        value = _unescape_value(rhs)
        if op != "!=" and lhs == field and found is None:
            found = value
    return found


# -- label selectors (labels/selector.go) -------------------------------------------------

_END, _CLOSE, _COMMA, _NOT, _DOUBLE_EQ, _EQ, _GT, _ID, _IN, _LT, _NOT_EQ, _NOT_IN, _OPEN, _ERROR = range(14)
_STRING_TO_TOKEN = {
    b")": _CLOSE, b",": _COMMA, b"!": _NOT, b"==": _DOUBLE_EQ, b"=": _EQ, b">": _GT, b"in": _IN,
    b"<": _LT, b"!=": _NOT_EQ, b"notin": _NOT_IN, b"(": _OPEN,
}
_SPECIAL = frozenset(b"=!(),><")
_WHITESPACE = frozenset(b" \t\r\n")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_INT64 = re.compile(r"[+-]?[0-9]+")


def _lex(data: bytes) -> list[tuple[int, bytes]]:
    """Every token up to the end. As Go's lexer, a NUL byte reads as the end of the string."""
    items: list[tuple[int, bytes]] = []
    pos = 0

    def read() -> int:
        nonlocal pos
        if pos < len(data):
            pos += 1
            return data[pos - 1]
        return 0

    while True:
        ch = read()
        while ch in _WHITESPACE:
            ch = read()
        if ch == 0:
            items.append((_END, b""))
            return items
        pos -= 1
        buffer = bytearray()
        if ch in _SPECIAL:
            last: tuple[int, bytes] | None = None
            while True:
                ch = read()
                if ch == 0:
                    break
                if ch not in _SPECIAL:
                    pos -= 1
                    break
                buffer.append(ch)
                token = _STRING_TO_TOKEN.get(bytes(buffer))
                if token is not None:
                    last = (token, bytes(buffer))
                elif last is not None:
                    pos -= 1
                    break
            items.append(last if last is not None else (_ERROR, bytes(buffer)))
        else:
            while True:
                ch = read()
                if ch == 0:
                    break
                if ch in _SPECIAL or ch in _WHITESPACE:
                    pos -= 1
                    break
                buffer.append(ch)
            literal = bytes(buffer)
            items.append((_STRING_TO_TOKEN.get(literal, _ID), literal))


def _is_int64(value: str) -> bool:
    return bool(_INT64.fullmatch(value)) and -(2**63) <= int(value) < 2**63


def _check_key(key: str) -> None:
    parts = key.split("/")
    if len(parts) > 2:
        raise SelectorError(f"invalid label key {key!r}")
    name = parts[-1]
    if len(parts) == 2 and not (parts[0] and len(parts[0]) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(parts[0])):
        raise SelectorError(f"invalid label key {key!r}: bad prefix")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise SelectorError(f"invalid label key {key!r}")


def _check_value(value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise SelectorError(f"invalid label value {value!r}")


def parse_label_selector(selector: str) -> None:
    """Nothing when ``selector`` parses as ``labels.Parse`` parses it; :class:`SelectorError` if not."""
    items = _lex(selector.encode("utf-8", "surrogateescape"))
    position = 0

    def peek() -> tuple[int, str]:
        token, literal = items[position]
        # In the Values context (the only one the parser looks ahead in) in/notin are identifiers.
        return (_ID if token in (_IN, _NOT_IN) else token), literal.decode("utf-8", "surrogateescape")

    def take(values: bool = True) -> tuple[int, str]:
        nonlocal position
        token, literal = items[position]
        position += 1
        if values and token in (_IN, _NOT_IN):
            token = _ID
        return token, literal.decode("utf-8", "surrogateescape")

    while True:
        token, literal = peek()
        if token == _END:
            return
        if token not in (_ID, _NOT):
            raise SelectorError(f"found {literal!r}, expected: !, identifier, or 'end of string'")
        # parseKeyAndInferOperator
        negated = False
        token, key = take()
        if token == _NOT:
            negated = True
            token, key = take()
        if token != _ID:
            raise SelectorError(f"found {key!r}, expected: identifier")
        _check_key(key)
        # "!key" and a bare "key" take no operator; anything after them must be "," or the end.
        if not negated and peek()[0] not in (_END, _COMMA):
            token, literal = take(values=False)
            if token in (_IN, _NOT_IN):
                values = _parse_set(take, peek)
            elif token in (_EQ, _DOUBLE_EQ, _NOT_EQ, _GT, _LT):
                if peek()[0] in (_END, _COMMA):
                    values = {""}
                else:
                    value_token, value = take()
                    if value_token != _ID:
                        raise SelectorError(f"found {value!r}, expected: identifier")
                    values = {value}
                if token in (_GT, _LT) and not all(_is_int64(v) for v in values):
                    raise SelectorError("for 'Gt', 'Lt' operators, the value must be an integer")
            else:
                raise SelectorError(f"found {literal!r}, expected: an operator")
            for value in values:
                _check_value(value)
        token, literal = take()
        if token == _END:
            return
        if token != _COMMA:
            raise SelectorError(f"found {literal!r}, expected: ',' or 'end of string'")
        if peek()[0] not in (_ID, _NOT):
            raise SelectorError(f"found {peek()[1]!r}, expected: identifier after ','")


def _parse_set(take: Callable[..., tuple[int, str]], peek: Callable[[], tuple[int, str]]) -> set[str]:
    """``( a, b, )`` — parseValues and parseIdentifiersList."""
    token, literal = take()
    if token != _OPEN:
        raise SelectorError(f"found {literal!r} expected: '('")
    token, literal = peek()
    if token == _CLOSE:
        take()
        return {""}
    if token not in (_ID, _COMMA):
        raise SelectorError(f"found {literal!r}, expected: ',', ')' or identifier")
    values: set[str] = set()
    while True:
        token, literal = take()
        if token == _ID:
            values.add(literal)
            following, text = peek()
            if following == _COMMA:
                continue
            if following == _CLOSE:
                break
            raise SelectorError(f"found {text!r}, expected: ',' or ')'")
        if token == _COMMA:
            if not values:
                values.add("")
            following, _ = peek()
            if following == _CLOSE:
                values.add("")
                break
            if following == _COMMA:
                values.add("")
            continue
        raise SelectorError(f"found {literal!r}, expected: ',', or identifier")
    token, literal = take()
    if token != _CLOSE:
        raise SelectorError(f"found {literal!r}, expected: ')'")
    return values
