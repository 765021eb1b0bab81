"""JSON decoded as the Go services behind the gateway decode it, and the one re-encoding sent on.

Admission judges a Python model of a body; what the receiver acts on is its own Go
decoding of the bytes it gets. The two must be the same document, so every body is
decoded here by Go's rules and what goes upstream is :func:`dumps` of the decoded
(and admitted) object — never the client's bytes.

:func:`loads` — the text as kube-apiserver (``sigs.k8s.io/json``) and Go's
``encoding/json`` read it, or a 400:

* an object with a key twice is :class:`DuplicateField` naming the key and its JSON
  pointer (Python keeps the last value, Go's decoder merges both into a struct;
  kube-apiserver's strict field validation reports ``duplicate field``);
* an integer outside int64, or a number that overflows a float64 (``1e400``), is
  :class:`NumberOutOfRange`: Go refuses it for typed fields and would round it for
  untyped ones (``sigs.k8s.io/json``: int64 when ``strconv.ParseInt`` takes it, else
  float64), so no exact big integer is judged that the receiver reads differently.
  Integer literals stay ``int`` and others ``float`` — the split ``ParseInt`` makes —
  so ``1`` and ``1.0`` re-encode as what they were (``1.0`` stays a float64 to an
  untyped field and is refused by a typed int field, as sent);
* the text must be UTF-8 (Go would replace invalid bytes with U+FFFD, byte by byte,
  where Python's replacement differs: refused rather than guessed); ``NaN``,
  ``Infinity`` and a byte-order mark are not JSON;
* a lone UTF-16 surrogate escape (``"\\ud800"``) becomes U+FFFD in keys and strings,
  as Go's ``unquote`` does (Python would keep the surrogate; a key that becomes
  another key that way is a duplicate).

:func:`dumps` is compact and deterministic (``ensure_ascii=False``, keys in the
order decoded): a function of the admitted object only.

What a Go struct then makes of the document — keys matched case-insensitively,
a field given twice merged — is :mod:`bcs_middleware.core.gotypes`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from itertools import accumulate
from typing import Any

from .errors import BadRequest, BodyTooDeep, MalformedBody

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Integers a float64 holds exactly; an untyped (interface{}) Go field reads a number
#: as a float64, so beyond this an integer is rounded by the receiver.
FLOAT64_EXACT = 2**53


class DuplicateField(BadRequest):
    """An object gives one key twice (400, as kube-apiserver's strict field validation)."""

    code_name = "DUPLICATE_FIELD"


class NumberOutOfRange(BadRequest):
    """A number the receiver's Go types cannot hold exactly (400)."""

    code_name = "NUMBER_OUT_OF_RANGE"


# -- reading ---------------------------------------------------------------------------------

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{},:')
_WINDOW = 1 << 16
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1
# int64 has 19 digits: text without a run of 19 digits holds no integer outside it.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def structure(data: bytes | bytearray) -> bytes:
    """JSON text with the strings cut out: the brackets and separators that remain.

    In C, without a regular expression and without a piece per string: escaped
    backslashes and escaped quotes go first (only when there are escapes), every
    character but quotes, brackets and separators is deleted, and what lies between
    quotes — string content — is dropped a window at a time, so a body of many short
    strings never becomes as many objects. Text that is not JSON may be misjudged,
    which only changes which 400 it gets.
    """
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = data.translate(None, _NOT_STRUCTURE)
    pieces, inside = [], False
    for start in range(0, len(kept), _WINDOW):
        parts = kept[start:start + _WINDOW].split(b'"')
        pieces.append(b"".join(parts[1 if inside else 0::2]))
        inside ^= len(parts) % 2 == 0
    return b"".join(pieces)


def depth_exceeds(data: bytes | bytearray, limit: int, *, stripped: bytes | None = None) -> bool:
    """Whether JSON text nests deeper than ``limit``, found without recursing.

    Strings are cut out first (a ``[`` inside one is not structure; ``stripped`` is
    :func:`structure` of ``data`` when the caller has it), then the running sum of
    opening (+1) and closing (-1) brackets is taken in C (``accumulate`` over ``map``).
    """
    brackets = (structure(data) if stripped is None else stripped).translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > limit


def value_count(stripped: bytes) -> int:
    """The values and object keys a document holds, from its :func:`structure`.

    Each begins the document, follows a ``:`` (a member's value), or follows a ``[``, ``{``
    or ``,`` (an element or a key) unless its container is empty: one plus every ``:``,
    ``,``, ``[`` and ``{``, less the empty ``[]`` and ``{}``.
    """
    return (1 + stripped.count(b":") + stripped.count(b",") + stripped.count(b"[") + stripped.count(b"{")
            - stripped.count(b"[]") - stripped.count(b"{}"))


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _OutOfRange(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate(_first_duplicate(pairs))
    return obj


def _first_duplicate(pairs: Iterable[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no duplicate")  # pragma: no cover - called only when there is one


def _int(text: str) -> int:
    if len(text) > 20:
        raise _OutOfRange(text)
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _OutOfRange(text)
    return value


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _OutOfRange(text)
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def loads(data: bytes | bytearray | str, *, what: str = "request body", max_depth: int = 100,
          measure: Callable[[int, int], None] | None = None) -> Any:
    """A JSON document as Go reads it (see the module doc); 400s name ``what``.

    ``measure(length, values)``, when given, is called before anything is built with the
    text's length and :func:`value_count` — the caller's chance to refuse, or to account
    for, what decoding will cost (a Python object per value). A ``bytearray`` is consumed:
    emptied once decoded to text, so a large body is not held twice while it is parsed.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    stripped = structure(raw)
    if depth_exceeds(raw, max_depth, stripped=stripped):
        raise BodyTooDeep(f"{what} nests deeper than the limit of {max_depth} levels")
    if measure is not None:
        measure(len(raw), value_count(stripped))
    del stripped
    long_digits = _LONG_DIGITS.search(raw) is not None
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if isinstance(data, str):
        text = data
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedBody(f"{what} is not UTF-8 text") from None
        if isinstance(data, bytearray):
            data.clear()
    del raw, data
    try:
        document = json.loads(text, object_pairs_hook=_object, parse_float=_float,
                              parse_int=_int if long_digits else None, parse_constant=_constant)
    except _Duplicate as dup:
        raise DuplicateField(_duplicate_message(what, dup.key, _where_duplicate(text))) from None
    except _OutOfRange as big:
        raise NumberOutOfRange(
            f"{what} holds the number {big.text[:40]}{'…' if len(big.text) > 40 else ''}, which the "
            "receiver cannot hold exactly: integers must fit in 64 bits, other numbers in a float64"
        ) from None
    except ValueError:  # json.JSONDecodeError included
        raise MalformedBody(f"{what} is not JSON") from None
    if surrogates:
        document = _replace_surrogates(document, [], what)
    return document


def _where_duplicate(text: str) -> str | None:
    """The JSON pointer of the first duplicated member (a second, marking parse; errors only)."""
    marked: list[tuple[dict[str, Any], str]] = []

    def mark(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs) and not marked:
            marked.append((obj, _first_duplicate(pairs)))
        return obj

    try:
        root = json.loads(text, object_pairs_hook=mark, parse_constant=_constant)
    except ValueError:
        return None  # broken further on: the key alone is named
    if not marked:  # pragma: no cover - the first parse found one
        return None
    target, key = marked[0]
    stack: list[tuple[Any, list[str | int]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return pointer([*path, key])
        if isinstance(node, dict):
            stack.extend((value, [*path, k]) for k, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, [*path, i]) for i, value in enumerate(node))
    return None  # pragma: no cover


def _duplicate_message(what: str, key: str, where: str | None) -> str:
    at = f" at {printable(where)}" if where is not None else ""
    return (f"{what} has the field {quoted(key)} twice{at}: duplicate fields are refused, as "
            "kube-apiserver's strict field validation refuses them")


def quoted(text: str, limit: int = 200) -> str:
    """Client text for a message: JSON-quoted (control characters escaped), cut at ``limit``."""
    text_json = json.dumps(text[:limit], ensure_ascii=False)
    return text_json if len(text) <= limit else text_json[:-1] + '…"'


def printable(text: str, limit: int = 400) -> str:
    """Client text for a message, unquoted: characters that are not printable as ``\\uXXXX``."""
    cut = text[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in cut)
    return cut if len(text) <= limit else cut + "…"


def _replace_surrogates(node: Any, path: list[str | int], what: str) -> Any:
    if isinstance(node, str):
        return _LONE_SURROGATE.sub("\ufffd", node)
    if isinstance(node, list):
        return [_replace_surrogates(item, [*path, i], what) for i, item in enumerate(node)]
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            fixed = _LONE_SURROGATE.sub("\ufffd", key)
            if fixed in out:
                raise DuplicateField(_duplicate_message(what, fixed, pointer([*path, fixed])))
            out[fixed] = _replace_surrogates(value, [*path, fixed], what)
        return out
    return node


def replace_lone_surrogates(text: str) -> str:
    """``text`` with every lone UTF-16 surrogate replaced by U+FFFD (Go's reading of it)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def check_number(value: Any, what: str) -> Any:
    """``value`` when a number a Go receiver holds exactly (int64, finite float64), else 400."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        raise NumberOutOfRange(f"{what} holds the integer {str(value)[:40]}, outside 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberOutOfRange(f"{what} holds a number JSON has no form for ({value})")
    return value


def pointer(path: Iterable[str | int]) -> str:
    """RFC 6901 JSON pointer of ``path``."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


# -- writing -----------------------------------------------------------------------------------


def dumps_around(envelope: Mapping[str, Any], placeholder: str, encoded: bytes) -> list[bytes]:
    """:func:`dumps` of ``envelope`` where its value ``placeholder`` is ``encoded`` (an object's
    :func:`dumps`, spliced in by reference, not copied): the pieces to send, in order.

    ``placeholder`` must be text no client can have put in ``envelope`` (a random one
    per call); if it does not occur exactly once the whole is encoded plainly.
    """
    whole = dumps(envelope)
    marker = json.dumps(placeholder).encode()
    before, found, after = whole.partition(marker)
    if not found or marker in after:
        raise ValueError("the placeholder must occur exactly once")
    return [before, encoded, after]


def dumps(obj: Any) -> bytes:
    """The one encoding of an object the gateway sends: compact UTF-8 JSON, keys in their order.

    A lone surrogate (none survives :func:`loads`) is sent as U+FFFD, as a Go
    receiver would read it, so a webhook and the upstream read the same text.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")
