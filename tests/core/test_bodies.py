"""``parse_json``/``parse_yaml``: the nesting bound is exact, strings do not count, nothing recurses away."""

from __future__ import annotations

import pytest

from bcs_middleware.core.bodies import MAX_DEPTH, parse_json, parse_yaml
from bcs_middleware.core.errors import BadRequest, BodyTooDeep, MalformedBody


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("parse", [parse_json, parse_yaml])
def test_the_limit_is_exact(parse) -> None:  # type: ignore[no-untyped-def]
    assert parse(_nested(MAX_DEPTH)) is not None
    with pytest.raises(BodyTooDeep, match=f"limit of {MAX_DEPTH} levels"):
        parse(_nested(MAX_DEPTH + 1))


@pytest.mark.parametrize("parse", [parse_json, parse_yaml])
@pytest.mark.parametrize("size", [1000, 100_000])
def test_no_recursion_error_escapes(parse, size: int) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BodyTooDeep):
        parse("[" * size)
    with pytest.raises(BodyTooDeep):
        parse('{"a":' * size)


@pytest.mark.parametrize("text", [
    pytest.param('{"s": "' + "[" * 500 + '"}', id="brackets-in-a-string"),
    pytest.param('["\\"' + "{" * 500 + '"]', id="after-an-escaped-quote"),
    pytest.param('["\\\\", "' + "[" * 500 + '"]', id="after-an-escaped-backslash"),
])
def test_brackets_inside_strings_are_not_structure(text: str) -> None:
    assert parse_json(text)


def test_malformed_and_invalid_utf8() -> None:
    with pytest.raises(MalformedBody):
        parse_json(b"[1,")
    with pytest.raises(MalformedBody):
        parse_json(b'"\xff"')
    with pytest.raises(MalformedBody) as yaml_error:
        parse_yaml(b"a: [1")
    assert yaml_error.value.code_name == "BAD_YAML"


def test_yaml_anchors_alone_are_fine_aliases_are_refused() -> None:
    assert parse_yaml("a: &x 1\nb: 2\n") == {"a": 1, "b": 2}
    with pytest.raises(BadRequest) as refused:
        parse_yaml("a: &x [1]\nb: *x\n")
    assert refused.value.code_name == "YAML_ALIAS_REFUSED"
    assert not isinstance(refused.value, MalformedBody)  # a refusal, not something to forward unparsed
