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
(:mod:`bcs_middleware.gojson`): a key twice in one object is a 400
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
        try:
            piece = stream.read(min(remaining, _PIECE))
        except TimeoutError:  # the server's body idle timeout (a client that stopped sending)
            raise body_stalled() from None
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


def has_body(environ: dict[str, Any]) -> bool:
    """Whether the request carries a body (a non-zero ``Content-Length``, or chunked framing)."""
    length = declared_length(environ)
    if length is not None:
        return length > 0
    return bool(environ.get("wsgi.input_terminated")
                or "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower())


class BufferSlots:
    """At most ``size`` whole request bodies buffered at once in this process.

    A body in memory costs a multiple of its size (its bytes, the decoded object, the
    re-encoding, what is sent to webhooks), so the layer that buffers takes a slot for
    as long as it holds one — until the response ends. A request that finds none free
    waits up to ``wait`` seconds, then gets a 429 with ``Retry-After`` (the answer of
    kube-apiserver's in-flight limit), before anything of its body is read.
    """

    def __init__(self, size: int, wait: float, *, what: str = "request") -> None:
        if size <= 0 or wait < 0:
            raise ValueError("the number of buffered bodies must be positive and the wait not negative")
        self.size, self.wait, self.what = size, wait, what
        self._free = threading.BoundedSemaphore(size)

    def claim(self) -> BufferSlots.Slot:
        """A slot for one request, taken by :meth:`Slot.acquire` once it is sure to buffer."""
        return BufferSlots.Slot(self)

    class Slot:
        __slots__ = ("_owner", "held")

        def __init__(self, owner: BufferSlots) -> None:
            self._owner, self.held = owner, False

        def acquire(self) -> None:
            owner = self._owner
            if not self.held:
                if not owner._free.acquire(timeout=owner.wait):
                    raise BCSError(
                        f"too many {owner.what} bodies are being processed at once ({owner.size}); retry shortly",
                        status=429, code_name="TOO_MANY_REQUESTS", headers=[("Retry-After", "1")])
                self.held = True

        def release(self) -> None:
            if self.held:
                self.held = False
                self._owner._free.release()

        def until_done(self, iterable: Iterable[bytes]) -> Iterable[bytes]:
            """``iterable`` (a response body), releasing this slot when it is exhausted or closed."""
            return _Releasing(iterable, self.release)


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


def parse_json(data: bytes | str, *, what: str = "request body", max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document from outside, read as Go reads it (:func:`bcs_middleware.gojson.loads`):
    :class:`BodyTooDeep` beyond ``max_depth`` levels, :class:`MalformedBody` when it is not
    JSON, ``DUPLICATE_FIELD``/``NUMBER_OUT_OF_RANGE`` (all 400s naming ``what``)."""
    return gojson.loads(data, what=what, max_depth=max_depth)


class _RefusedYAML(yaml.YAMLError):
    def __init__(self, error: BadRequest) -> None:
        super().__init__(error.message)
        self.error = error


class _BoundedSafeLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases and nesting deeper than ``max_depth`` and builds
    only what JSON can hold, read as Go reads it (see the module doc).

    Depth is checked in ``compose_node``, before it recurses into a collection, so the
    recursion itself is bounded; the event parser underneath does not recurse.
    """

    def __init__(self, stream: Any, *, what: str, max_depth: int) -> None:
        super().__init__(stream)
        self._what, self._max_depth, self._depth = what, max_depth, 0
        self._root: Any = None

    def compose_node(self, parent: Any, index: Any) -> Any:
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


def parse_yaml(data: bytes | str, *, what: str = "request body", max_depth: int = MAX_DEPTH) -> Any:
    """``yaml.safe_load`` for a document from outside (one document; YAML is a superset of JSON).

    Aliases → 400 ``YAML_ALIAS_REFUSED`` (merge keys ``YAML_MERGE_REFUSED``); deeper than
    ``max_depth`` → :class:`BodyTooDeep`; a key twice → ``DUPLICATE_FIELD``; numbers beyond
    int64/float64 → ``NUMBER_OUT_OF_RANGE``; binary, sets and ordered maps → ``BAD_YAML``;
    not YAML (or not UTF-8) → :class:`MalformedBody` (``BAD_YAML``) naming the line. The
    result holds only what JSON can (string keys; timestamps stay the text they were).
    """
    loader = None
    try:
        # The reader decodes the first bytes already (its errors are YAML errors too).
        loader = _BoundedSafeLoader(data, what=what, max_depth=max_depth)
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
