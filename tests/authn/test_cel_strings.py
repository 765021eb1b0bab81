"""The string extension as cel-go's ``ext.Strings`` documents it (``ext/strings.go``), results bounded."""

from __future__ import annotations

import time

import pytest

from bcs_middleware.authn.cel import EvaluationError, compile_expression, evaluate

# cel-go ext/strings.go: the examples of each function's documentation.
DOCUMENTED = [
    "'hello'.charAt(4) == 'o'", "'hello'.charAt(5) == ''",
    "'hello mellow'.indexOf('') == 0", "'hello mellow'.indexOf('ello') == 1",
    "'hello mellow'.indexOf('jello') == -1", "'hello mellow'.indexOf('', 2) == 2",
    "'hello mellow'.indexOf('ello', 2) == 7",
    "'hello mellow'.lastIndexOf('') == 12", "'hello mellow'.lastIndexOf('ello') == 7",
    "'hello mellow'.lastIndexOf('jello') == -1", "'hello mellow'.lastIndexOf('ello', 6) == 1",
    "'TacoCat'.lowerAscii() == 'tacocat'", "'TacoCÆt Xii'.lowerAscii() == 'tacocÆt xii'",
    "'TacoCat'.upperAscii() == 'TACOCAT'", "'TacoCÆt Xii'.upperAscii() == 'TACOCÆT XII'",
    "'hello hello'.replace('he', 'we') == 'wello wello'", "'hello hello'.replace('he', 'we', -1) == 'wello wello'",
    "'hello hello'.replace('he', 'we', 1) == 'wello hello'", "'hello hello'.replace('he', 'we', 0) == 'hello hello'",
    "'hello hello'.replace('', '_') == '_h_e_l_l_o_ _h_e_l_l_o_'", "'hello hello'.replace('h', '') == 'ello ello'",
    "'hello hello hello'.split(' ') == ['hello', 'hello', 'hello']", "'hello hello hello'.split(' ', 0) == []",
    "'hello hello hello'.split(' ', 1) == ['hello hello hello']",
    "'hello hello hello'.split(' ', 2) == ['hello', 'hello hello']",
    "'hello hello hello'.split(' ', -1) == ['hello', 'hello', 'hello']",
    "'tacocat'.substring(4) == 'cat'", "'tacocat'.substring(0, 4) == 'taco'",
    "'  \\ttrim\\n    '.trim() == 'trim'",
    "['hello', 'mellow'].join() == 'hellomellow'", "['hello', 'mellow'].join(' ') == 'hello mellow'",
    "[].join() == ''", "[].join('/') == ''",
    # Indices count code points, as cel-go's runes.
    "'héllo'.indexOf('l') == 2", "'héllo'.substring(1, 2) == 'é'",
]


@pytest.mark.parametrize("expression", DOCUMENTED)
def test_documented_examples(expression: str) -> None:
    assert evaluate(compile_expression(expression, "claims", "bool"), {}) is True


@pytest.mark.parametrize("expression", ["'hello'.charAt(6) == ''", "'hello mellow'.indexOf('ello', 20) == 0",
                                        "'hello mellow'.lastIndexOf('ello', -1) == 0",
                                        "'tacocat'.substring(-1) == ''", "'tacocat'.substring(2, 1) == ''"])
def test_out_of_range_is_an_error(expression: str) -> None:
    with pytest.raises(EvaluationError, match="index out of range"):
        evaluate(compile_expression(expression, "claims", "bool"), {})


@pytest.mark.parametrize("expression", [
    "claims.s" + ".replace('a', 'aa')" * 25 + ".size() > 0",  # doubles 25 times (the parser nests 32 deep)
    "claims.s.replace('', claims.s).size() > 0",  # squares the input
    "claims.a.map(x, claims.s).join(',').size() > 0",
])
def test_no_expression_grows_a_string_past_the_bound(expression: str) -> None:
    claims = {"s": "a" * 2000, "a": ["x"] * 100}
    started = time.monotonic()
    with pytest.raises(EvaluationError, match="string result longer than 65536 characters"):
        evaluate(compile_expression(expression, "claims", "bool"), claims)
    # Refused before the string is built, so whatever || says the work stayed small.
    assert evaluate(compile_expression(f"{expression} || true", "claims", "bool"), claims) is True
    assert time.monotonic() - started < 5
