"""Go's ``encoding/json`` decoding of a document into a Go type, for the bcs services.

:func:`decode` applies a Go type (:class:`Struct`, :class:`Ptr`, :class:`Slice`,
:class:`Map`, :class:`Interface` and the scalars) to a document read by
:func:`bcs_middleware.core.gojson.loads` exactly as ``encoding/json``'s
``decodeState.object``/``array``/``literalStore`` do (``encoding/json/decode.go``;
the bk-bcs driver and scheduler decode with it):

* a key matches a field's tag exactly, else case-insensitively (Unicode simple
  folding, ``foldName``; the first field in Go's order wins) — and is rewritten to
  the tag's spelling, so everything after sees one spelling;
* a field given twice in different spellings gets each value in order: a later
  scalar replaces, a later object is decoded *into* the struct, pointer or map
  already there, a later array into the elements already there (a third array into
  one slice is refused: Go would then reuse elements beyond the slice's length that
  its backing array still holds, which depends on the runtime's growth policy);
* ``null`` sets pointers, maps, slices and interfaces to nil and leaves any other
  field as it was (its zero value when it was not set); a map's or a new slice
  element's ``null`` is the element type's zero value, as Go stores it;
* an ``interface{}`` value holds numbers as float64 (an integer beyond 2**53 is
  the float64 Go rounds it to) and is replaced whole, never merged;
* unknown keys are ignored by Go: forwarded as sent, except two unknown keys that
  differ only in case (a receiver that knows the field would read both into it);
* what Go refuses — a string for an int, ``1.5`` or ``1e2`` for an int, a number
  outside the field's type, text that is not RFC 3339 for a ``time.Time`` — is
  :class:`GoTypeError` (Go's ``UnmarshalTypeError``) naming the JSON pointer.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import BadRequest
from .gojson import FLOAT64_EXACT, INT64_MAX, INT64_MIN, DuplicateField, pointer, printable, quoted


class GoTypeError(BadRequest):
    """A value Go's decoder refuses for the field's type (its ``UnmarshalTypeError``; 400)."""

    code_name = "JSON_DECODE"


@dataclass(frozen=True)
class Scalar:
    """A Go scalar: ``string``, ``bool``, ``int``/``int32``/``int64``/``uint32``/``uint64``,
    ``float64`` or ``time`` (``time.Time``: RFC 3339 text)."""

    go: str


@dataclass(frozen=True)
class Ptr:
    elem: GoType


@dataclass(frozen=True)
class Slice:
    elem: GoType


@dataclass(frozen=True)
class Map:
    """``map[string]elem``."""

    elem: GoType


@dataclass(frozen=True)
class Interface:
    """``interface{}`` (and ``json.RawMessage``-like values kept as decoded)."""


@dataclass(frozen=True)
class Field:
    """One struct field as Go's decoder sees it: the key it matches (its tag's name, or
    the Go field name when untagged) and its type."""

    name: str
    type: GoType


@dataclass(frozen=True)
class Struct:
    """A Go struct's decodable fields in Go's field order (embedded structs flattened)."""

    name: str
    fields: tuple[Field, ...]
    exact: Mapping[str, Field] = field(init=False, repr=False, compare=False)
    folded: Mapping[str, Field] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: dict[str, Field] = {}
        folded: dict[str, Field] = {}
        for item in self.fields:
            if not item.name.isascii():
                raise ValueError(f"{self.name}.{item.name}: tags are matched by ASCII folding here")
            exact[item.name] = item
            folded.setdefault(fold(item.name), item)  # the first folded match takes precedence
        object.__setattr__(self, "exact", exact)
        object.__setattr__(self, "folded", folded)

    def match(self, key: str) -> Field | None:
        """The field ``key`` sets, as ``encoding/json`` finds it (exact name, else folded)."""
        return self.exact.get(key) or self.folded.get(fold(key))


GoType = Scalar | Ptr | Slice | Map | Interface | Struct

STRING, BOOL, FLOAT64, TIME = Scalar("string"), Scalar("bool"), Scalar("float64"), Scalar("time")
INT, INT32, INT64, UINT32, UINT64 = (Scalar("int"), Scalar("int32"), Scalar("int64"), Scalar("uint32"),
                                     Scalar("uint64"))
ANY = Interface()

_INT_RANGES = {"int": (INT64_MIN, INT64_MAX), "int64": (INT64_MIN, INT64_MAX),
               "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1)}
_ZERO: dict[str, Any] = {"string": "", "bool": False, "float64": 0, "time": "0001-01-01T00:00:00Z",
                         **{name: 0 for name in _INT_RANGES}}
# time.Time.UnmarshalJSON → parseStrictRFC3339 (Go's time/format_rfc3339.go).
_RFC3339 = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
                      r"(Z|[+-]([0-9]{2}):([0-9]{2}))")


def fold(key: str) -> str:
    """Go's ``foldName``: ASCII upper-cased, other runes the smallest of their simple-fold orbit.

    Exact for every key that can match an ASCII tag: the only non-ASCII runes that
    fold onto ASCII letters are KELVIN SIGN (``k``) and LONG S (``s``). Between two
    non-ASCII keys the orbit is approximated by the rune's upper and lower case.
    """
    if key.isascii():
        return key.upper()
    out = []
    for char in key:
        if char.isascii():
            out.append(char.upper())
            continue
        candidates = [c for c in (char, char.upper(), char.lower()) if len(c) == 1]
        smallest = min(candidates, key=ord)
        out.append(smallest.upper() if smallest.isascii() else smallest)
    return "".join(out)


def decode(document: Any, gotype: GoType, *, what: str = "request body") -> Any:
    """``document`` (from :func:`loads`) as Go decodes it into ``gotype``, keys in tag spelling."""
    return _Decoder(what).value(document, gotype, None, [])


class _Decoder:
    def __init__(self, what: str) -> None:
        self.what = what
        # Slices decoded into before, by id (kept alive so an id is never reused meanwhile).
        self.slices: dict[int, int] = {}
        self.keep: list[list[Any]] = []

    def error(self, value: Any, gotype: GoType, path: list[str | int]) -> GoTypeError:
        described = (
            "null" if value is None else "bool" if isinstance(value, bool)
            else f"number {value}" if isinstance(value, int | float) else "string" if isinstance(value, str)
            else "array" if isinstance(value, list) else "object"
        )
        target = gotype.name if isinstance(gotype, Struct) else _go_name(gotype)
        return GoTypeError(f"{self.what}: json: cannot unmarshal {described} into Go value of type {target} "
                           f"at {printable(pointer(path) or '/')}")

    def value(self, raw: Any, gotype: GoType, existing: Any, path: list[str | int]) -> Any:
        if isinstance(gotype, Struct):
            return self.struct(raw, gotype, existing, path)
        if isinstance(gotype, Ptr):
            # null sets the pointer to nil; anything else is decoded into what it points at.
            return None if raw is None else self.value(raw, gotype.elem, existing, path)
        if isinstance(gotype, Slice):
            return self.slice(raw, gotype, existing, path)
        if isinstance(gotype, Map):
            return self.map(raw, gotype, existing, path)
        if isinstance(gotype, Interface):
            return _untyped(raw)  # replaced whole, never merged (decodeState.object/array)
        return self.scalar(raw, gotype, existing, path)

    def struct(self, raw: Any, gotype: Struct, existing: Any, path: list[str | int]) -> Any:
        if raw is None:  # a no-op for a struct: what was there, else its zero value
            return existing if isinstance(existing, dict) else {}
        if not isinstance(raw, dict):
            raise self.error(raw, gotype, path)
        out: dict[str, Any] = existing if isinstance(existing, dict) else {}
        unknown = {fold(key): key for key in out if key not in gotype.exact}
        for key, item in raw.items():
            found = gotype.match(key)
            if found is None:
                # Go ignores it. Forwarded as sent, unless another unknown key differs from it
                # only in case: a receiver that knows the field would merge the two.
                folded = fold(key)
                if unknown.setdefault(folded, key) != key:
                    raise DuplicateField(
                        f"{self.what} has the fields {quoted(unknown[folded])} and {quoted(key)} at "
                        f"{printable(pointer(path) or '/')}, which differ only in case: a receiver that knows the "
                        "field reads both into it")
                out[key] = item
                continue
            out[found.name] = self.value(item, found.type, out.get(found.name), [*path, found.name])
        return out

    def slice(self, raw: Any, gotype: Slice, existing: Any, path: list[str | int]) -> Any:
        if raw is None:
            return None
        if not isinstance(raw, list):
            raise self.error(raw, gotype, path)
        out: list[Any] = existing if isinstance(existing, list) else []
        times = self.slices.get(id(out), 0)
        if times >= 2:
            # A third array into one slice: Go decodes into the elements its backing array
            # still holds beyond the length, which depends on the runtime's growth policy.
            raise GoTypeError(f"{self.what} sets the array at {printable(pointer(path) or '/')} three times or more "
                              "(in different spellings of its fields): refused, as the receiver's result "
                              "would depend on memory reuse")
        for index, item in enumerate(raw):
            if index < len(out):
                out[index] = self.value(item, gotype.elem, out[index], [*path, index])
            else:
                out.append(self.value(item, gotype.elem, None, [*path, index]))
        del out[len(raw):]
        self.slices[id(out)] = times + 1
        self.keep.append(out)
        return out

    def map(self, raw: Any, gotype: Map, existing: Any, path: list[str | int]) -> Any:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise self.error(raw, gotype, path)
        out: dict[str, Any] = existing if isinstance(existing, dict) else {}
        for key, item in raw.items():  # a map's element is decoded fresh, never merged
            out[key] = self.value(item, gotype.elem, None, [*path, key])
        return out

    def scalar(self, raw: Any, gotype: Scalar, existing: Any, path: list[str | int]) -> Any:
        kind = gotype.go
        if raw is None:  # a no-op: what was there, else the zero value Go leaves
            return existing if existing is not None else _ZERO[kind]
        if kind == "string":
            if isinstance(raw, str):
                return raw
        elif kind == "bool":
            if isinstance(raw, bool):
                return raw
        elif kind == "float64":
            if isinstance(raw, float):
                return raw
            if isinstance(raw, int) and not isinstance(raw, bool):
                return float(raw) if abs(raw) > FLOAT64_EXACT else raw
        elif kind == "time":
            if isinstance(raw, str) and _is_rfc3339(raw):
                return raw
        else:
            low, high = _INT_RANGES[kind]
            if type(raw) is int and low <= raw <= high:
                return raw
        raise self.error(raw, gotype, path)


def _untyped(value: Any) -> Any:
    """An ``interface{}`` value as Go holds it: numbers are float64s (integers beyond 2**53 rounded)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value) if abs(value) > FLOAT64_EXACT else value
    if isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, int | list | dict) and not isinstance(item, bool):
                value[index] = _untyped(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, int | list | dict) and not isinstance(item, bool):
                value[key] = _untyped(item)
    return value


def _is_rfc3339(text: str) -> bool:
    match = _RFC3339.fullmatch(text)
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    if match.group(9) is not None and (int(match.group(9)) > 23 or int(match.group(10)) > 59):
        return False
    try:
        datetime.datetime(year or 2000, month, day, hour, minute, second)  # year 0 is a leap year too
    except ValueError:
        return False
    return True


def _go_name(gotype: GoType) -> str:
    if isinstance(gotype, Scalar):
        return "time.Time" if gotype.go == "time" else gotype.go
    if isinstance(gotype, Ptr):
        return "*" + _go_name(gotype.elem)
    if isinstance(gotype, Slice):
        return "[]" + _go_name(gotype.elem)
    if isinstance(gotype, Map):
        return "map[string]" + _go_name(gotype.elem)
    if isinstance(gotype, Struct):
        return gotype.name
    return "interface {}"
