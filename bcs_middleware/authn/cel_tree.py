"""The tree of a checked CEL expression, read from its ``cel.expr.CheckedExpr`` encoding.

The engine (:mod:`.cel`, cel-cpp through ``cel-expr-python``) hands a compiled expression out only
as its serialized form: a ``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr``
(``cel/expr/checked.proto``: field 4 ``expr``) whose ``Expr`` is ``cel/expr/syntax.proto``'s. The
few questions kube-apiserver asks of an expression's tree at load — which ``claims.x`` it selects
(``validation.go`` ``hasSelectExp``), how deep its comprehensions nest, which fields of ``user``
it reads — are answered from that tree here; the protobuf wire format is read directly (varints
and length-delimited fields only: nothing else is needed, and no generated classes exist for
``cel.expr`` in this environment).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Node", "read_checked"]

# cel/expr/syntax.proto, message Expr: the oneof expr_kind.
_CONST, _IDENT, _SELECT, _CALL, _LIST, _STRUCT, _COMPREHENSION = 3, 4, 5, 6, 7, 8, 9
_KINDS = {_CONST: "const", _IDENT: "ident", _SELECT: "select", _CALL: "call", _LIST: "list",
          _STRUCT: "struct", _COMPREHENSION: "comprehension"}
#: An encoded tree deeper than this is refused (the parser's own limit is lower).
_MAX_DEPTH = 512


@dataclass(frozen=True)
class Node:
    """One ``Expr``: its kind; ``text`` is an ident's name, a select's field, a call's function or a
    string constant's value; ``children`` are its operand, target and arguments, elements, or the
    comprehension's range, init, condition, step and result, in the message's order."""

    kind: str
    text: str = ""
    children: tuple[Node, ...] = ()

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


def read_checked(serialized: bytes) -> Node:
    """The ``Expr`` of a serialized ``Any{CheckedExpr}`` (:class:`ValueError` when it is not one)."""
    value = _only(serialized, 2)  # Any.value
    return _expr(_only(value, 4), 0)  # CheckedExpr.expr


def _varint(data: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """``(field number, value)`` of each field: bytes for length-delimited ones, else an int."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            yield number, data[at:at + size]
            at += size
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            yield number, 0
        else:
            raise ValueError(f"unexpected wire type {wire}")


def _only(data: bytes, number: int) -> bytes:
    for found, value in _fields(data):
        if found == number and isinstance(value, bytes):
            return value
    raise ValueError(f"field {number} missing")


def _expr(data: bytes, depth: int) -> Node:
    if depth > _MAX_DEPTH:
        raise ValueError("expression tree too deep")
    for number, value in _fields(data):
        if number in _KINDS and isinstance(value, bytes):
            return _kind(number, value, depth + 1)
    return Node("unspecified")


def _kind(number: int, data: bytes, depth: int) -> Node:
    kind = _KINDS[number]
    text = ""
    children: list[Node] = []
    for field, value in _fields(data):
        if not isinstance(value, bytes):
            continue
        if number == _CONST and field == 6:  # Constant.string_value
            text = value.decode("utf-8", "replace")
        elif number == _IDENT and field == 1:  # Ident.name
            text = value.decode()
        elif number == _SELECT:  # Select: operand = 1, field = 2
            if field == 1:
                children.append(_expr(value, depth))
            elif field == 2:
                text = value.decode()
        elif number == _CALL:  # Call: target = 1, function = 2, args = 3
            if field in (1, 3):
                children.append(_expr(value, depth))
            elif field == 2:
                text = value.decode()
        elif number == _LIST and field == 1:  # CreateList.elements
            children.append(_expr(value, depth))
        elif number == _STRUCT and field == 2:  # CreateStruct.entries: map_key = 3, value = 4
            children.extend(_expr(part, depth) for key, part in _fields(value)
                            if key in (3, 4) and isinstance(part, bytes))
        elif number == _COMPREHENSION and field in (2, 4, 5, 6, 7):  # range, init, condition, step, result
            children.append(_expr(value, depth))
    return Node(kind, text, tuple(children))
