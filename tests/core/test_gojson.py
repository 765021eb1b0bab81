"""gojson (JSON as Go reads it) and gotypes (a Go type applied as encoding/json applies it).

The expectations are Go's: ``encoding/json/decode.go`` (``object``: exact tag, else the first field
whose folded name matches, each key applied in order, objects decoded into the value already there;
``array``: elements decoded into the elements already there; ``literalStore``: null a no-op but for
pointers, maps, slices and interfaces; ``strconv.ParseInt`` for int fields) and ``sigs.k8s.io/json``
for untyped numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bcs_middleware.core import gojson
from bcs_middleware.core.bodies import BufferBudget, decoded_cost, parse_json, parse_yaml
from bcs_middleware.core.errors import BCSError, MalformedBody, PayloadTooLarge
from bcs_middleware.core.gojson import DuplicateField, NumberOutOfRange
from bcs_middleware.core.gotypes import (
    ANY,
    BOOL,
    INT,
    INT32,
    STRING,
    TIME,
    UINT32,
    Field,
    GoTypeError,
    Map,
    Ptr,
    Slice,
    Struct,
    decode,
    fold,
)
from bcs_middleware.scheduler import routes, v4fields

INNER = Struct("Inner", (Field("a", STRING), Field("b", INT), Field("tags", Map(STRING))))
OUTER = Struct("Outer", (
    Field("kind", STRING), Field("inner", INNER), Field("ptr", Ptr(INNER)), Field("list", Slice(INNER)),
    Field("ptrs", Slice(Ptr(INNER))), Field("any", ANY), Field("ok", BOOL), Field("n32", INT32),
    Field("u32", UINT32), Field("when", TIME), Field("names", Slice(STRING)),
))


def go(text: str, gotype: Any = OUTER) -> Any:
    return decode(gojson.loads(text), gotype)


# -- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "pointer"), [
    pytest.param('{"a": 1, "a": 2}', "/a", id="top"),
    pytest.param('{"x": [{"y": {"k": 1, "k": 2}}]}', "/x/0/y/k", id="nested"),
    pytest.param('{"a/b~c": {"d": 1}, "a/b~c": 2}', "/a~1b~0c", id="pointer-escapes"),
])
def test_a_key_twice_is_named_with_its_pointer(text: str, pointer: str) -> None:
    with pytest.raises(DuplicateField, match=f"twice at {pointer}:"):
        gojson.loads(text)


def test_a_duplicate_in_broken_text_is_still_named() -> None:
    with pytest.raises(DuplicateField, match='"a" twice:'):
        gojson.loads('{"x": {"a": 1, "a": 2}, ')


@pytest.mark.parametrize("text", ["9223372036854775808", "-9223372036854775809", "1e309", "-1e309",
                                  "1" * 5000])
def test_numbers_beyond_int64_and_float64_are_refused(text: str) -> None:
    with pytest.raises(NumberOutOfRange):
        gojson.loads(f"[{text}]")


def test_numbers_keep_the_kind_parseint_gives_them() -> None:
    assert gojson.loads("[9223372036854775807, -0, 1.0, 1e2, 1e-400, 0.1]") == [2**63 - 1, 0, 1.0, 100.0, 0.0, 0.1]
    assert [type(v) for v in gojson.loads("[1, 1.0, 1e2]")] == [int, float, float]
    assert gojson.dumps(gojson.loads('{"x": 1E2, "y": -0.0, "z": 1.0}')) == b'{"x":100.0,"y":-0.0,"z":1.0}'


def test_lone_surrogates_read_as_u_fffd_in_keys_and_strings() -> None:
    assert gojson.loads(r'{"k\ud800": ["\udc00x", "\ud83d\ude00"]}') == {"k\ufffd": ["\ufffdx", "\U0001f600"]}
    with pytest.raises(DuplicateField, match="twice at /k"):
        gojson.loads(r'{"k\ud800": 1, "k\udbff": 2}')
    # an escaped backslash before "ud800" is text, not an escape
    assert gojson.loads(r'["\\ud800"]') == ["\\ud800"]


@pytest.mark.parametrize("data", [b'"\xff"', b"\xef\xbb\xbf{}", b"[NaN]", b"[Infinity]", b'{"a": 1} x',
                                  b"[1,"])
def test_what_go_does_not_read_as_json_is_refused(data: bytes) -> None:
    with pytest.raises(MalformedBody):
        gojson.loads(data)


def test_a_bytearray_is_consumed_and_measured_before_decoding() -> None:
    buffer = bytearray(b'{"a": [1, 2, {"b": "[,:{"}]}')
    length = len(buffer)
    seen: list[tuple[int, int]] = []
    assert gojson.loads(buffer, measure=lambda length, values: seen.append((length, values))) == {
        "a": [1, 2, {"b": "[,:{"}]}
    assert buffer == b"" and seen == [(length, 8)]  # the string's brackets are not structure


def test_structure_cuts_strings_with_escapes_out() -> None:
    assert gojson.structure(rb'{"a\\":"x\"[","b":[1,{"c":"}"}]}') == b'{:,:[,{:}]}'
    assert gojson.structure(b'["' + b"[" * 200_000 + b'"]') == b"[]"


def test_dumps_is_compact_utf8_in_key_order_and_splices_an_encoding_by_reference() -> None:
    obj = {"z": "é", "a": [1, {"x": None}]}
    assert gojson.dumps(obj) == '{"z":"é","a":[1,{"x":null}]}'.encode()
    inner = gojson.dumps(obj)
    pieces = gojson.dumps_around({"request": {"name": "n", "object": "\x00mark\x00"}}, "\x00mark\x00", inner)
    assert pieces[1] is inner and b"".join(pieces) == gojson.dumps({"request": {"name": "n", "object": obj}})
    with pytest.raises(ValueError, match="exactly once"):
        gojson.dumps_around({"a": "\x00m\x00", "b": "\x00m\x00"}, "\x00m\x00", inner)


# -- YAML -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("a: 1\nb:\n  c: 1\n  c: 2\n", '"c" twice at /b/c (line 4)', id="nested"),
    pytest.param("1: x\n'1': y\n", '"1" twice at /1', id="key-that-becomes-the-same-json-key"),
    pytest.param("n: 18446744073709551616\n", "outside 64 bits", id="big-integer"),
    pytest.param("n: .inf\n", "no form for", id="infinity"),
    pytest.param("m:\n  <<: {a: 1}\n", "merge key", id="merge-key"),
    pytest.param("s: !!set {a, b}\n", "JSON has no form for", id="set"),
])
def test_yaml_is_refused_where_json_would_be(text: str, message: str) -> None:
    with pytest.raises(BCSError, match=re.escape(message)):
        parse_yaml(text)


def test_yaml_keys_and_timestamps_become_what_json_holds() -> None:
    assert parse_yaml("1: a\ntrue: b\nnull: c\nd: 2001-12-14\n") == {"1": "a", "true": "b", "null": "c",
                                                                      "d": "2001-12-14"}


def test_a_yaml_body_of_too_many_values_is_refused() -> None:
    with pytest.raises(PayloadTooLarge):
        parse_yaml("- {}\n" * 2000, max_nodes=1024)


# -- Go's decoding into types ------------------------------------------------------------------


def test_keys_match_tags_case_insensitively_and_take_the_tags_spelling() -> None:
    assert go('{"KIND": "x", "Inner": {"A": "y"}}') == {"kind": "x", "inner": {"a": "y"}}
    # Go folds KELVIN SIGN to K and LONG S to S (unicode.SimpleFold): both still the "kind" field
    assert go('{"\\u212aind": "k"}') == {"kind": "k"}
    assert fold("\u017fpec") == "SPEC" and fold("ß") == "ß"


def test_a_field_given_twice_takes_each_value_in_order_and_merges_objects() -> None:
    assert go('{"kind": "a", "Kind": "b"}') == {"kind": "b"}
    assert go('{"inner": {"a": "x", "tags": {"k": "1"}}, "INNER": {"b": 2, "tags": {"j": "2"}}}') == {
        "inner": {"a": "x", "tags": {"k": "1", "j": "2"}, "b": 2}}
    # a pointer already set is decoded into; null sets it to nil
    assert go('{"ptr": {"a": "x"}, "Ptr": {"b": 1}}') == {"ptr": {"a": "x", "b": 1}}
    assert go('{"ptr": {"a": "x"}, "PTR": null}') == {"ptr": None}


def test_a_second_array_is_decoded_into_the_elements_already_there() -> None:
    assert go('{"list": [{"a": "x"}, {"a": "y"}], "List": [{"b": 1}]}') == {"list": [{"a": "x", "b": 1}]}
    assert go('{"ptrs": [{"a": "x"}], "PTRS": [{"b": 1}, {"b": 2}]}') == {"ptrs": [{"a": "x", "b": 1}, {"b": 2}]}
    with pytest.raises(GoTypeError, match="three times"):
        go('{"list": [{}], "List": [{}], "LIST": [{}]}')


def test_null_leaves_values_that_are_not_pointers_maps_slices_or_interfaces() -> None:
    assert go('{"kind": "x", "Kind": null, "inner": null, "ok": null}') == {"kind": "x", "inner": {}, "ok": False}
    assert go('{"names": ["a", null], "inner": {"tags": {"k": null}}}') == {"names": ["a", ""],
                                                                           "inner": {"tags": {"k": ""}}}


def test_interfaces_are_replaced_whole_and_hold_float64s() -> None:
    assert go('{"any": {"a": 1}, "ANY": {"b": 2}}') == {"any": {"b": 2}}
    assert go('{"any": [9007199254740993, 1]}') == {"any": [9007199254740992.0, 1]}


def test_unknown_keys_are_forwarded_unless_two_differ_only_in_case() -> None:
    assert go('{"extra": {"X": 1}, "kind": "k"}') == {"extra": {"X": 1}, "kind": "k"}
    with pytest.raises(DuplicateField, match="differ only in case"):
        go('{"extra": 1, "EXTRA": 2}')


@pytest.mark.parametrize(("text", "where"), [
    pytest.param('{"kind": 1}', "/kind", id="number-for-a-string"),
    pytest.param('{"inner": {"b": 1.5}}', "/inner/b", id="fraction-for-an-int"),
    pytest.param('{"inner": {"b": 1e2}}', "/inner/b", id="exponent-for-an-int"),
    pytest.param('{"n32": 2147483648}', "/n32", id="beyond-int32"),
    pytest.param('{"u32": -1}', "/u32", id="negative-unsigned"),
    pytest.param('{"ok": "true"}', "/ok", id="string-for-a-bool"),
    pytest.param('{"inner": []}', "/inner", id="array-for-a-struct"),
    pytest.param('{"when": "yesterday"}', "/when", id="not-rfc3339"),
    pytest.param('{"when": "2024-02-30T00:00:00Z"}', "/when", id="no-such-day"),
])
def test_what_go_refuses_for_a_field_is_refused_naming_it(text: str, where: str) -> None:
    with pytest.raises(GoTypeError, match=f"at {where}$"):
        go(text)


def test_times_go_parses_are_kept() -> None:
    assert go('{"when": "2024-02-29T23:59:59.5+08:00"}') == {"when": "2024-02-29T23:59:59.5+08:00"}


# -- the bcs v4 tables -----------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "uri", "expected"), [
    ("POST", "namespaces/ns/applications", v4fields.REPLICA_CONTROLLER),
    ("PUT", "namespaces/ns/processes/rollback", v4fields.REPLICA_CONTROLLER),
    ("PUT", "namespaces/ns/deployments", v4fields.BCS_DEPLOYMENT),
    ("POST", "namespaces/ns/daemonset", v4fields.BCS_DAEMONSET),
    ("POST", "namespaces/ns/configmaps", v4fields.BCS_CONFIG_MAP),
    ("PUT", "namespaces/ns/secrets", v4fields.BCS_SECRET),
    ("POST", "namespaces/ns/services", v4fields.BCS_SERVICE),
    ("POST", "namespaces/ns/applications/a/taskgroups/t/message", v4fields.SEND_MSG_OPE_PARAM),
    ("POST", "agentsettings", v4fields.AGENT_SETTINGS),
    ("PUT", "agentsettings/extendedresource", Ptr(v4fields.EXTENDED_RESOURCE)),
    ("POST", "command/deployment/ns/d", v4fields.BCS_COMMAND),
    ("GET", "namespaces/ns/applications", None),
    ("POST", "somewhere/else", None),
])
def test_each_route_reads_the_type_the_source_decodes_it_into(method: str, uri: str, expected: Any) -> None:
    assert routes.body_type(method, uri) == expected


@pytest.mark.parametrize("fixture", sorted(p.name for p in (Path(__file__).parents[1] / "mesos" / "fixtures").rglob(
    "*.json")))
def test_reading_a_document_twice_changes_nothing_more(fixture: str) -> None:
    path = next((Path(__file__).parents[1] / "mesos" / "fixtures").rglob(fixture))
    document = parse_json(path.read_bytes())
    uri = "namespaces/ns/deployments" if "eployment" in fixture else (
        "namespaces/ns/daemonset" if "daemonset" in fixture else "namespaces/ns/applications")
    once = routes.canonical("POST", uri, document)
    assert routes.canonical("POST", uri, json.loads(json.dumps(once))) == once


# -- the budget ------------------------------------------------------------------------------------


def test_the_budget_reserves_the_worst_then_keeps_the_estimate_and_refuses_beyond_the_limit() -> None:
    budget = BufferBudget(total=1000, request_limit=600, wait=0)
    first = budget.claim()
    first.reserve(600)
    second = budget.claim()
    with pytest.raises(BCSError, match="retry shortly") as busy:
        second.reserve(600)
    assert busy.value.status == 429 and ("Retry-After", "1") in busy.value.headers
    first.fit(10, 1)  # measured: 5 times 10 bytes, and one value
    assert budget.free == 1000 - decoded_cost(10, 1)
    second.reserve(600)
    with pytest.raises(PayloadTooLarge, match="too many values"):
        second.fit(100, 100)
    first.release()
    second.release()
    assert budget.free == 1000
