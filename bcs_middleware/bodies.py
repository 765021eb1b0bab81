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
"""

from __future__ import annotations

import io
import json
import re
from itertools import accumulate
from typing import Any

import yaml

from .errors import BadRequest, BCSError, BodyTooDeep, MalformedBody, PayloadTooLarge

#: Deepest nesting of arrays/objects (mappings/sequences) accepted in any parsed document.
#: Kubernetes objects, CRD schemas included, stay well below it; Python's recursion
#: limit (1000 frames, several per level in the parsers) stays well above it.
MAX_DEPTH = 100

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1

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


def replace_body(environ: dict[str, Any], body: bytes, *, content_type: str | None = None) -> None:
    """Give the next layer ``body`` as its input, with the right length and no chunked framing."""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    if content_type is not None:
        environ["CONTENT_TYPE"] = content_type


def _json_depth_exceeds(data: bytes, limit: int) -> bool:
    """Whether JSON text nests deeper than ``limit``, found without recursing.

    Strings are cut out first (a ``[`` inside one is not structure), then the
    running sum of opening (+1) and closing (-1) brackets is taken in C
    (``accumulate`` over ``map``); text that is not JSON may be misjudged, which
    only changes which 400 it gets.
    """
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > limit


def parse_json(data: bytes | str, *, what: str = "request body", max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for a document from outside: :class:`BodyTooDeep` beyond ``max_depth``
    levels, :class:`MalformedBody` when it is not JSON (both 400s naming ``what``)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _json_depth_exceeds(raw, max_depth):
        raise BodyTooDeep(f"{what} nests deeper than the limit of {max_depth} levels")
    try:
        return json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        raise MalformedBody(f"{what} is not JSON") from None


class _RefusedYAML(yaml.YAMLError):
    def __init__(self, error: BadRequest) -> None:
        super().__init__(error.message)
        self.error = error


class _BoundedSafeLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases and nesting deeper than ``max_depth``.

    Checked in ``compose_node``, before it recurses into a collection, so the
    recursion itself is bounded; the event parser underneath does not recurse.
    """

    def __init__(self, stream: Any, *, what: str, max_depth: int) -> None:
        super().__init__(stream)
        self._what, self._max_depth, self._depth = what, max_depth, 0

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


def parse_yaml(data: bytes | str, *, what: str = "request body", max_depth: int = MAX_DEPTH) -> Any:
    """``yaml.safe_load`` for a document from outside (one document; YAML is a superset of JSON).

    Aliases → 400 ``YAML_ALIAS_REFUSED``; deeper than ``max_depth`` → :class:`BodyTooDeep`;
    not YAML (or not UTF-8) → :class:`MalformedBody` (``BAD_YAML``) naming the line.
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
