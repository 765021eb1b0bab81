"""CEL expressions of the authentication configuration: compiled once, evaluated bounded.

The engine is cel-cpp, Google's reference implementation of CEL, through its Python bindings
(``cel-expr-python``): the language kube-apiserver's cel-go speaks, optional types included
(``claims.?x.orValue(…)``, ``[?…]``, ``{?…}``, ``optional.of``) and RE2 ``matches``, with
the string extension (``split``, ``join``, ``lowerAscii``, ``replace``…) as :mod:`.cel_strings`
gives it: bounded.

As kube-apiserver compiles them (``k8s.io/apiserver/pkg/authentication/cel/compile.go``):
``claims`` is a ``map(string, dyn)``; the expression is type-checked when the file loads, and
a validation rule (claim or user) must be typed ``bool`` ("must evaluate to bool"), a mapping
anything. ``user`` is kube-apiserver's ``kubernetes.UserInfo`` object there; here it is a map
whose fields are checked at load against that object's (``username``, ``uid``, ``groups``,
``extra``: "undefined field" otherwise), so the same files are refused.

Bounds, since kube-apiserver bounds every evaluation by a cost budget:

* an expression is at most :data:`MAX_EXPRESSION_LENGTH` characters and may nest
  comprehensions (``all``, ``exists``, ``map``, ``filter``…) at most
  :data:`MAX_COMPREHENSION_DEPTH` deep — refused when the configuration loads;
* one evaluation runs at most cel-cpp's comprehension iteration budget (10,000 iterations over
  all its comprehensions, the bindings' fixed setting); past it the evaluation fails as an
  error that ``||``/``&&`` cannot absorb (``tests/authn/test_verify.py`` shows both);
* ``map`` and ``filter`` build their list by copying it at each step in cel-cpp (quadratic: 80 ms
  and 38 MB for 1,000 entries, 1 s and 280 MB for 4,000 on the shared machine): an expression that
  builds a list in a comprehension runs only on input whose lists hold at most
  :data:`MAX_LIST_BUILDING` entries (celpy's step budget stopped such a ``map`` near there too);
  lists the expression makes itself (``split``, ``+``) are bounded by the iteration budget only;
* a string function's result is at most 64 Ki characters (:mod:`.cel_strings`): no expression
  doubles a string until the worker runs out of memory;
* its input is a verified token's claims, whose size the request's header limit bounds
  (:data:`MAX_INPUT_BYTES` is checked again here);
* each token's identity is computed once and cached until it expires, so an expression
  runs once per token, not once per request.

An evaluation error (a missing claim without ``has()``, a type mismatch) is
:class:`EvaluationError` — never a value, so no rule reads an error as ``true``; a result
that is no plain value (an optional) is the same error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from cel_expr_python import cel
from cel_expr_python.ext import ext_optional

from .cel_strings import DECLARATIONS as STRING_FUNCTIONS
from .cel_tree import Node, read_checked

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "CompiledExpression",
    "EvaluationError",
    "compile_expression",
    "evaluate",
    "selects",
]

#: kube-apiserver bounds expressions by cost; a length bound is the static half of that here.
MAX_EXPRESSION_LENGTH = 4096
#: ``a.all(x, b.exists(y, …))`` is quadratic in the claims; deeper nesting is refused.
MAX_COMPREHENSION_DEPTH = 2
#: The largest serialized input evaluated (a token's claims travel in a request header).
MAX_INPUT_BYTES = 64 * 1024
#: The longest input list an expression that builds a list in a comprehension (``map``,
#: ``filter``) is evaluated on.
MAX_LIST_BUILDING = 1000
#: ``kubernetes.UserInfo``'s fields (compile.go ``buildUserType``).
USER_FIELDS = frozenset({"username", "uid", "groups", "extra"})

Variable = Literal["claims", "user"]
Returns = Literal["bool", "any"]

_OBJECT = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
_ENVIRONMENTS = {name: cel.NewEnv(variables={name: _OBJECT}, extensions=[ext_optional.ExtOptional()],
                                  functions=STRING_FUNCTIONS)
                 for name in ("claims", "user")}


class EvaluationError(Exception):
    """An expression failed, or returned no plain value: never a result."""


@dataclass(frozen=True)
class CompiledExpression:
    """One type-checked expression over one variable (``claims`` or ``user``), ready to run."""

    source: str
    variable: str
    program: Any = field(repr=False, compare=False, hash=False)
    tree: Node = field(repr=False, compare=False, hash=False)
    #: it has a comprehension that accumulates a list (``map``/``filter``: ``accu_init`` is ``[]``)
    builds_lists: bool = False


def compile_expression(source: str, variable: str, returns: Returns = "any") -> CompiledExpression:
    """Parse and type-check ``source``; :class:`ValueError` says why it is refused.

    :param returns: ``bool`` for a validation rule (its checked type must be ``bool``).
    """
    if variable not in _ENVIRONMENTS:
        raise ValueError(f"no CEL variable {variable!r}")
    if len(source) > MAX_EXPRESSION_LENGTH:
        raise ValueError(f"longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        program = _ENVIRONMENTS[variable].compile(source)
    except RuntimeError as exc:
        raise ValueError(_compile_error(exc)) from None
    if returns == "bool" and program.return_type() != cel.Type.BOOL:
        raise ValueError(f"must evaluate to bool but got {program.return_type().name().lower()}")
    tree = read_checked(program.serialize())
    depth = _comprehension_depth(tree)
    if depth > MAX_COMPREHENSION_DEPTH:
        raise ValueError(f"comprehensions nested {depth} deep (at most {MAX_COMPREHENSION_DEPTH})")
    if variable == "user":
        unknown = sorted(name for operand, name in _selections(tree) if operand == "user" and name not in USER_FIELDS)
        if unknown:
            fields = ", ".join(sorted(USER_FIELDS))
            raise ValueError(f"undefined field {unknown[0]!r} (kubernetes.UserInfo has {fields})")
    builds_lists = any(node.kind == "comprehension" and len(node.children) > 1 and node.children[1].kind == "list"
                       and not node.children[1].children for node in tree.walk())
    return CompiledExpression(source, variable, program, tree, builds_lists)


def evaluate(expression: CompiledExpression, value: Any) -> Any:
    """The expression's result on ``value`` (JSON-shaped), as a plain Python value.

    :raises EvaluationError: the evaluation failed (never a value that could pass for a result).
    """
    if len(json.dumps(value, separators=(",", ":"))) > MAX_INPUT_BYTES:
        raise EvaluationError(f"input larger than {MAX_INPUT_BYTES} bytes")
    if expression.builds_lists and _longest_list(value) > MAX_LIST_BUILDING:
        raise EvaluationError(f"cost budget exceeded: map/filter over a list of more than {MAX_LIST_BUILDING} entries")
    try:
        result = expression.program.eval(data={expression.variable: value})
    except RuntimeError as exc:
        # cel-cpp ends an evaluation this way when its iteration budget runs out: an error no
        # ``||`` absorbs, as cel-go's exhausted cost budget is.
        text = str(exc)
        if "budget exceeded" in text:
            raise EvaluationError("cost budget exceeded: more than 10000 comprehension iterations") from None
        raise EvaluationError(_short(text)) from None
    try:
        if result.type() == cel.Type.ERROR:
            raise EvaluationError(_short(str(result.value())))
        return result.plain_value()
    except TypeError:
        # The bindings convert no optional (nor other value without a Python form) back.
        raise EvaluationError("the result is not a plain value (an optional? use .orValue(…))") from None


def selects(expression: CompiledExpression, operand: str, name: str) -> bool:
    """Whether ``expression`` reads ``operand.name`` (validation.go ``hasSelectExp``: a select,
    a ``has()`` test, or an optional select ``operand.?name``)."""
    return (operand, name) in _selections(expression.tree)


def _selections(tree: Node) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for node in tree.walk():
        if node.kind == "select" and node.children and node.children[0].kind == "ident":
            found.add((node.children[0].text, node.text))
        elif node.kind == "call" and node.text == "_?._" and len(node.children) == 2 \
                and node.children[0].kind == "ident" and node.children[1].kind == "const":
            found.add((node.children[0].text, node.children[1].text))
    return found


def _longest_list(value: Any) -> int:
    if isinstance(value, dict):
        return max(map(_longest_list, value.values()), default=0)
    if isinstance(value, list):
        return max(len(value), *map(_longest_list, value))
    return 0


def _comprehension_depth(node: Node) -> int:
    inner = max((_comprehension_depth(child) for child in node.children), default=0)
    return inner + 1 if node.kind == "comprehension" else inner


def _compile_error(exc: RuntimeError) -> str:
    """cel-cpp's message less its status code and source excerpt: ``<input>:1:8: Syntax error: …``."""
    text = str(exc).split(" [INVALID_ARGUMENT]", 1)[0]
    text = text.removeprefix("INVALID_ARGUMENT: ").removeprefix("ERROR: ")
    return _short(text.split("\n", 1)[0])


def _short(text: str) -> str:
    return " ".join(text.split())[:200]
