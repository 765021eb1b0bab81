"""Bounded request-body reading: the one way a layer reads a whole body.

Only three places need a whole body — the management API (JSON), the admission
layer (the object it sends to webhooks) and the Mesos route (YAML to JSON); the
proxy streams everything else. Each reads through :func:`read_bounded`, so a
declared ``Content-Length`` over the limit is refused before reading anything, and
a chunked body (gunicorn sets ``wsgi.input_terminated``) is read to one byte past
the limit to tell "exactly at" from "over".

Whatever parses a document that came from outside — a client's body, a webhook's
or an apiserver's answer, an RBAC source, a definitions file — parses it with
:func:`parse_json` or :func:`parse_yaml`: nesting deeper than :data:`MAX_DEPTH` is a
400 ``BODY_TOO_DEEP`` decided *before* any recursive parser runs (Python's and
PyYAML's parsers recurse per level, and a few KiB of ``[`` would otherwise end in a
``RecursionError``), and YAML aliases are refused (``YAML_ALIAS_REFUSED``), so a
document's parsed size is bounded by its byte size — a few hundred bytes of nested
aliases can otherwise expand to gigabytes.

Both read a document as the Go services behind the gateway read it
(:mod:`bcs_middleware.core.gojson`): a key twice in one object is a 400
``DUPLICATE_FIELD`` naming the key and its JSON pointer (PyYAML, like Python's
``json``, would silently keep the last one), integers must fit in 64 bits and
floats be finite (400 ``NUMBER_OUT_OF_RANGE``), and lone UTF-16 surrogates read as
U+FFFD. A YAML mapping key that is not a string becomes the string JSON gives it
(``1`` → ``"1"``, ``true`` → ``"true"``), so ``1:`` and ``"1":`` in one mapping are
a duplicate too.
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import yaml

from . import gojson
from .errors import BadRequest, BCSError, BodyTooDeep, MalformedBody, PayloadTooLarge

#: Deepest nesting of arrays/objects (mappings/sequences) accepted in any parsed document.
#: Kubernetes objects, CRD schemas included, stay well below it; Python's recursion
#: limit (1000 frames, several per level in the parsers) stays well above it.
MAX_DEPTH = 100

_PIECE = 64 * 1024


def _read(stream: Any, limit: int) -> bytes:
    chunks, remaining = [], limit
    while remaining > 0:
        piece = _piece(stream, min(remaining, _PIECE))
        if not piece:
            break
        chunks.append(piece)
        remaining -= len(piece)
    return b"".join(chunks)


def body_stalled() -> BCSError:
    """The error for a request body that stopped arriving (the server's read timed out)."""
    return BCSError("the request body stopped arriving before its end", status=408,
                    code_name="REQUEST_TIMEOUT")


def declared_length(environ: dict[str, Any]) -> int | None:
    """The request's ``Content-Length``, ``None`` when absent; 400 when not a non-negative number."""
    length_header = str(environ.get("CONTENT_LENGTH") or "").strip()
    if not length_header:
        return None
    try:
        length = int(length_header)
    except ValueError:
        raise BadRequest("invalid Content-Length") from None
    if length < 0:
        raise BadRequest("invalid Content-Length")
    return length


def media_type(environ: dict[str, Any]) -> str:
    """The request's media type, lower case, without parameters (``""`` when absent)."""
    return str(environ.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()


def read_bounded(environ: dict[str, Any], limit: int, *, what: str = "request body") -> bytes:
    """The whole body, at most ``limit`` bytes: 413 beyond it, 400 for a bad ``Content-Length``."""
    stream = environ["wsgi.input"]
    length = declared_length(environ)
    if length is not None:
        if length > limit:
            raise PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes")
        return _read(stream, length)
    if environ.get("wsgi.input_terminated") or "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower():
        data = _read(stream, limit + 1)
        if len(data) > limit:
            raise PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes")
        return data
    return b""


def read_buffer(environ: dict[str, Any], limit: int, *, what: str = "request body") -> bytearray:
    """:func:`read_bounded` into one buffer, filled in place (no list of pieces joined at the end):
    a large body is in memory once while it is read. :func:`parse_json` consumes it."""
    stream = environ["wsgi.input"]
    length = declared_length(environ)
    if length is not None:
        if length > limit:
            raise PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes")
        buffer = bytearray(length)
        view, filled = memoryview(buffer), 0
        while filled < length:
            piece = _piece(stream, min(length - filled, _PIECE))
            if not piece:
                break
            view[filled:filled + len(piece)] = piece
            filled += len(piece)
        view.release()
        del buffer[filled:]
        return buffer
    buffer = bytearray()
    if environ.get("wsgi.input_terminated") or "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower():
        while len(buffer) <= limit and (piece := _piece(stream, _PIECE)):
            buffer += piece
        if len(buffer) > limit:
            raise PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes")
    return buffer


def _piece(stream: Any, size: int) -> bytes:
    try:
        piece: bytes = stream.read(size)
    except TimeoutError:  # the server's body idle timeout (a client that stopped sending)
        raise body_stalled() from None
    return piece


def has_body(environ: dict[str, Any]) -> bool:
    """Whether the request carries a body (a non-zero ``Content-Length``, or chunked framing)."""
    length = declared_length(environ)
    if length is not None:
        return length > 0
    return bool(environ.get("wsgi.input_terminated")
                or "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower())


class BufferBudget:
    """The memory a process lets whole request bodies take at once, by estimate.

    A buffered body costs a multiple of its size — its bytes, the decoded text, a
    Python object per value (:func:`decoded_cost`), the re-encoding sent on — so the
    layer that buffers reserves from one budget for as long as it holds a body (until
    the response ends). Before reading it reserves what its declared length could cost
    at worst (capped at ``request_limit``; a chunked body the cap), and once the text
    is measured it keeps only its estimate: a body whose estimate exceeds
    ``request_limit`` is refused (413) before anything is built. A request that finds
    too little free waits up to ``wait`` seconds, then gets a 429 with ``Retry-After``
    (as kube-apiserver's in-flight limit answers), its body unread.

    :param total: bytes of estimate the process holds at most.
    :param request_limit: the most one body may cost; at most ``total``.
    :param wait: seconds a request waits for room.
    """

    def __init__(self, total: int, request_limit: int, wait: float, *, what: str = "request") -> None:
        if not 0 < request_limit <= total or wait < 0:
            raise ValueError("the budget must hold at least one request's limit, and the wait not be negative")
        self.total, self.request_limit, self.wait, self.what = total, request_limit, wait, what
        self._free = total
        self._changed = threading.Condition(threading.Lock())

    @property
    def free(self) -> int:
        return self._free

    def claim(self) -> BufferBudget.Slot:
        """An empty reservation for one request; it grows only through :meth:`Slot.reserve`."""
        return BufferBudget.Slot(self)

    def _take(self, amount: int) -> None:
        deadline = time.monotonic() + self.wait
        with self._changed:
            while self._free < amount:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BCSError(
                        f"too many large {self.what} bodies are being processed at once; retry shortly",
                        status=429, code_name="TOO_MANY_REQUESTS", headers=[("Retry-After", "1")])
                self._changed.wait(remaining)
            self._free -= amount

    def _give(self, amount: int) -> None:
        if amount:
            with self._changed:
                self._free += amount
                self._changed.notify_all()

    class Slot:
        __slots__ = ("_budget", "held")

        def __init__(self, budget: BufferBudget) -> None:
            self._budget, self.held = budget, 0

        def reserve_for(self, environ: dict[str, Any], limit: int) -> None:
            """Reserve the worst a body of the request's declared length (at most ``limit``) costs."""
            length = declared_length(environ)
            self.reserve(min(self._budget.request_limit,
                             decoded_cost(length, length) if length is not None and length <= limit
                             else self._budget.request_limit))

        def reserve(self, amount: int) -> None:
            if amount > self.held:
                self._budget._take(amount - self.held)
                self.held = amount

        def fit(self, length: int, values: int) -> None:
            """Keep what a measured body costs: 413 beyond the request limit, else shrink to it."""
            cost = decoded_cost(length, values)
            if cost > self._budget.request_limit:
                raise PayloadTooLarge(
                    f"the {self._budget.what} body holds too many values to be decoded here ({values} in "
                    f"{length} bytes, an estimated {cost >> 20} MiB once decoded; the limit is "
                    f"{self._budget.request_limit >> 20} MiB)")
            if cost < self.held:
                self._budget._give(self.held - cost)
                self.held = cost
            else:
                self.reserve(cost)

        def release(self) -> None:
            held, self.held = self.held, 0
            self._budget._give(held)

        def until_done(self, iterable: Iterable[bytes]) -> Iterable[bytes]:
            """``iterable`` (a response body), releasing this slot when it is exhausted or closed."""
            return _Releasing(iterable, self.release)


#: What one value of a YAML document costs while PyYAML composes and constructs it (its
#: events, its node with marks, the value): the bound on values a YAML body may hold.
YAML_NODE_COST = 1024


def yaml_node_limit(request_limit: int) -> int:
    """The values a YAML body may hold when decoding it may cost ``request_limit`` bytes
    (never fewer than 1024: a small document is never refused for its values)."""
    return max(1024, request_limit // YAML_NODE_COST)
#: Bytes a decoded value costs at most in CPython, counting its share of the work around it
#: (the key/value pairs the parser lists before it builds a dict, the pieces the encoder
#: lists before it joins them); a string's characters are counted with the text.
VALUE_COST = 96


def decoded_cost(length: int, values: int) -> int:
    """An upper bound of what holding a JSON body of ``length`` bytes with ``values`` values costs
    (measured: see bench/README.md, "Admission memory"): its bytes, its text, its encoding, the
    encoder's pieces and the characters inside its strings (5 times the length), and each value.
    At worst a value per two bytes (``[0,0,…]``)."""
    return 5 * length + VALUE_COST * min(values, length // 2 + 1)


class _Releasing:
    __slots__ = ("_iterable", "_release")

    def __init__(self, iterable: Iterable[bytes], release: Callable[[], None]) -> None:
        self._iterable, self._release = iterable, release

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._iterable
        finally:
            self._release()

    def close(self) -> None:
        try:
            close = getattr(self._iterable, "close", None)
            if close is not None:
                close()
        finally:
            self._release()


def replace_body(environ: dict[str, Any], body: bytes, *, content_type: str | None = None) -> None:
    """Give the next layer ``body`` as its input, with the right length and no chunked framing."""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    if content_type is not None:
        environ["CONTENT_TYPE"] = content_type


def parse_json(data: bytes | bytearray | str, *, what: str = "request body", max_depth: int = MAX_DEPTH,
               measure: Callable[[int, int], None] | None = None) -> Any:
    """A JSON document from outside, read as Go reads it (:func:`bcs_middleware.core.gojson.loads`):
    :class:`BodyTooDeep` beyond ``max_depth`` levels, :class:`MalformedBody` when it is not
    JSON, ``DUPLICATE_FIELD``/``NUMBER_OUT_OF_RANGE`` (all 400s naming ``what``);
    ``measure(length, values)`` sees its size before it is decoded; a ``bytearray`` is
    consumed (emptied once decoded to text, so the body is not held twice)."""
    return gojson.loads(data, what=what, max_depth=max_depth, measure=measure)


class _RefusedYAML(yaml.YAMLError):
    def __init__(self, error: BCSError) -> None:
        super().__init__(error.message)
        self.error = error


class _BoundedSafeLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases and nesting deeper than ``max_depth`` and builds
    only what JSON can hold, read as Go reads it (see the module doc).

    Depth is checked in ``compose_node``, before it recurses into a collection, so the
    recursion itself is bounded; the event parser underneath does not recurse.
    """

    def __init__(self, stream: Any, *, what: str, max_depth: int, max_nodes: int | None) -> None:
        super().__init__(stream)
        self._what, self._max_depth, self._depth = what, max_depth, 0
        self._nodes_left = max_nodes
        self._root: Any = None

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self._nodes_left is not None:
            self._nodes_left -= 1
            if self._nodes_left < 0:
                raise _RefusedYAML(PayloadTooLarge(f"{self._what} holds too many values to be decoded here"))
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise _RefusedYAML(BadRequest(
                f"{self._what} uses a YAML alias (line {mark.line + 1}); aliases are not accepted",
                code_name="YAML_ALIAS_REFUSED"))
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                raise _RefusedYAML(BodyTooDeep(
                    f"{self._what} nests deeper than the limit of {self._max_depth} levels"))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        self._root = node
        return super().construct_document(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        # Replaces SafeConstructor's: no merge keys (JSON has none; they mostly merge aliases),
        # keys as JSON strings, and a key twice is refused (PyYAML keeps the last).
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(None, None, "expected a mapping", node.start_mark)
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _RefusedYAML(BadRequest(
                    f"{self._what} uses a YAML merge key (line {key_node.start_mark.line + 1}); "
                    "merge keys are not accepted", code_name="YAML_MERGE_REFUSED"))
            key = _json_key(self.construct_object(key_node, deep=deep), self._what)
            if key in mapping:
                where = gojson.pointer([*_node_path(self._root, node), key])
                raise _RefusedYAML(gojson.DuplicateField(
                    f"{self._what} has the field {gojson.quoted(key)} twice at {gojson.printable(where)} "
                    f"(line {key_node.start_mark.line + 1}): duplicate fields are refused, as "
                    "kube-apiserver's strict field validation refuses them"))
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_checked_int(self, node: Any) -> int:
        value: int = self.construct_yaml_int(node)
        return self._number(value)

    def construct_checked_float(self, node: Any) -> float:
        value: float = self.construct_yaml_float(node)
        return self._number(value)

    def _number(self, value: Any) -> Any:
        try:
            return gojson.check_number(value, self._what)
        except BadRequest as exc:
            raise _RefusedYAML(exc) from None

    def construct_text(self, node: Any) -> str:
        return gojson.replace_lone_surrogates(self.construct_scalar(node))

    def refuse_non_json(self, node: Any) -> Any:
        raise _RefusedYAML(BadRequest(
            f"{self._what} holds a {node.tag.rsplit(':', 1)[-1]} (line {node.start_mark.line + 1}), "
            "which JSON has no form for", code_name="BAD_YAML"))


_BoundedSafeLoader.add_constructor("tag:yaml.org,2002:int", _BoundedSafeLoader.construct_checked_int)
_BoundedSafeLoader.add_constructor("tag:yaml.org,2002:float", _BoundedSafeLoader.construct_checked_float)
_BoundedSafeLoader.add_constructor("tag:yaml.org,2002:str", _BoundedSafeLoader.construct_text)
# Go's YAML readers hand an untyped timestamp on as the text it was written as.
_BoundedSafeLoader.add_constructor("tag:yaml.org,2002:timestamp", _BoundedSafeLoader.construct_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _BoundedSafeLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _BoundedSafeLoader.refuse_non_json)


def _json_key(key: Any, what: str) -> str:
    """A YAML mapping key as the JSON object key it becomes."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int) or (isinstance(key, float) and math.isfinite(key)):
        return json.dumps(key)
    raise _RefusedYAML(BadRequest(f"{what} has a mapping key JSON has no form for", code_name="BAD_YAML"))


def _node_path(root: Any, target: Any) -> list[str | int]:
    """The keys and indexes from ``root`` to the composed node ``target`` (errors only)."""
    stack: list[tuple[Any, list[str | int]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, yaml.MappingNode):
            stack.extend((value, [*path, str(key.value)]) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((value, [*path, index]) for index, value in enumerate(node.value))
    return []


def parse_yaml(data: bytes | str, *, what: str = "request body", max_depth: int = MAX_DEPTH,
               max_nodes: int | None = None) -> Any:
    """``yaml.safe_load`` for a document from outside (one document; YAML is a superset of JSON).

    Aliases → 400 ``YAML_ALIAS_REFUSED`` (merge keys ``YAML_MERGE_REFUSED``); deeper than
    ``max_depth`` → :class:`BodyTooDeep`; a key twice → ``DUPLICATE_FIELD``; numbers beyond
    int64/float64 → ``NUMBER_OUT_OF_RANGE``; binary, sets and ordered maps → ``BAD_YAML``;
    not YAML (or not UTF-8) → :class:`MalformedBody` (``BAD_YAML``) naming the line; more
    than ``max_nodes`` values (keys included) → :class:`PayloadTooLarge`. The result holds
    only what JSON can (string keys; timestamps stay the text they were).
    """
    loader = None
    try:
        # The reader decodes the first bytes already (its errors are YAML errors too).
        loader = _BoundedSafeLoader(data, what=what, max_depth=max_depth, max_nodes=max_nodes)
        return loader.get_single_data()
    except _RefusedYAML as exc:
        raise exc.error from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise MalformedBody(f"{what} does not parse as YAML{where}", code_name="BAD_YAML") from None
    except UnicodeDecodeError:
        raise MalformedBody(f"{what} is not UTF-8 text", code_name="BAD_YAML") from None
    finally:
        if loader is not None:
            loader.dispose()
