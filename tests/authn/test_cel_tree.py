"""The checked expression's tree, read from its cel.expr.CheckedExpr encoding."""

from __future__ import annotations

import pytest

from bcs_middleware.authn.cel import compile_expression, selects
from bcs_middleware.authn.cel_tree import read_checked


def test_selects_as_validation_go_has_select_exp() -> None:
    def reads(source: str) -> bool:
        return selects(compile_expression(source, "claims"), "claims", "email_verified")

    for source in ("claims.email_verified", "has(claims.email_verified) ? 'a' : 'b'",
                   "claims.?email_verified.orValue(false)", "[claims.x, {'k': claims.email_verified}]",
                   "claims.groups.all(g, claims.email_verified == true)"):
        assert reads(source), source
    for source in ("claims.email", "'claims.email_verified'", "claims['email_verified']", "claims.x.email_verified"):
        assert not reads(source), source


def test_the_tree_has_every_kind_of_node() -> None:
    tree = read_checked(compile_expression("[claims.a.map(x, x + 'y'), {'k': 1}, claims.?b]", "claims").program
                        .serialize())
    kinds = {node.kind for node in tree.walk()}
    assert {"list", "comprehension", "select", "ident", "call", "const", "struct"} <= kinds


@pytest.mark.parametrize("data", [b"", b"\x0a\x05abc", b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                                  b"\x0f"])
def test_what_is_not_a_checked_expression_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        read_checked(data)
