"""CEL expressions of the authentication configuration: compiled once, evaluated bounded.

The engine is ``cel-python`` (``celpy``): a pure-Python implementation of the CEL
specification (lark parser, RE2 for ``matches``) that evaluates the expressions
kube-apiserver's own tests of this authenticator use (``claims.x``, ``has()``,
``split``, ``startsWith``, ``all``/``exists``/``map``/``filter``, ternaries,
string concatenation; ``tests/authn/test_verify.py`` runs them). It has no optional
types, so kube-apiserver's ``claims.?x.orValue(…)`` is refused at load with a message
saying so (:data:`OPTIONAL_UNSUPPORTED`); ``has(claims.x) ? claims.x : …`` says the same.

Bounds, since the apiserver bounds every expression by a cost budget
(``k8s.io/apiserver/pkg/authentication/cel``: ``PerCallLimit``) and celpy keeps none:

* an expression is at most :data:`MAX_EXPRESSION_LENGTH` characters and may nest
  comprehensions (``all``, ``exists``, ``map``, ``filter``…) at most
  :data:`MAX_COMPREHENSION_DEPTH` deep — refused when the configuration loads;
* one evaluation visits at most :data:`MAX_STEPS` nodes of the parse tree (the macros'
  iterations included); past it the evaluation fails — an error, never a result
  (measured in ``bench/README.md``);
* its input is a verified token's claims, whose size the request's header limit bounds
  (:data:`MAX_INPUT_BYTES` is checked again here);
* each token's identity is computed once and cached until it expires, so an expression
  runs once per token, not once per request.

An evaluation error (a missing claim without ``has()``, a type mismatch) is
:class:`EvaluationError` — never a value, so no rule reads an error as ``true``; a
result of the wrong type is the same error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import celpy
import lark

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "OPTIONAL_UNSUPPORTED",
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

#: Parse-tree nodes one evaluation may visit: kube-apiserver bounds each expression by a cost
#: budget at run time; this is that budget for celpy (bench/README.md: what it costs).
MAX_STEPS = 10_000

_COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})

#: cel-go's optional types (``claims.?x``, ``list[?i]``, ``{?k: v}``, ``optional.of``…), which
#: kube-apiserver enables: cel-python (0.5.0, the newest) has neither the grammar for ``.?``/
#: ``[?``/``{?`` nor an optional type, so such an expression is refused when the file loads,
#: never half-evaluated.
OPTIONAL_UNSUPPORTED = (
    "CEL optional syntax (claims.?name, [?…], {?…}, optional.of/none, orValue/hasValue) is not supported: "
    "the gateway's CEL engine (cel-python) has no optional types; write has(claims.name) ? claims.name : "
    "<default> instead"
)
_OPTIONAL_SYNTAX = re.compile(r"\.\s*\?|[\[{]\s*\?")
_STRING_LITERAL = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


class CostExceeded(BaseException):
    """The evaluation used up its budget.

    A ``BaseException`` on purpose: celpy turns ``Exception`` subclasses raised inside an
    expression into CEL error values, and CEL's ``||``/``&&`` absorb an error when the other
    side decides: an exhausted budget must end the evaluation, never become an operand.
    """


class _BudgetedEvaluator(celpy.evaluation.Evaluator):
    """celpy's interpreter, counting the nodes it visits (its macros' sub-evaluators share the count)."""

    def __init__(self, ast: Any, activation: Any, budget: list[int] | None = None) -> None:
        super().__init__(ast, activation)
        self.budget = budget if budget is not None else [MAX_STEPS]

    def _visit_tree(self, tree: Any) -> Any:
        self.budget[0] -= 1
        if self.budget[0] < 0:
            raise CostExceeded(f"more than {MAX_STEPS} evaluation steps")
        return super()._visit_tree(tree)

    def sub_evaluator(self, ast: Any) -> _BudgetedEvaluator:
        return _BudgetedEvaluator(ast, activation=self.activation, budget=self.budget)


class _BudgetedRunner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        return _BudgetedEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


_ENVIRONMENT = celpy.Environment(runner_class=_BudgetedRunner)


class EvaluationError(Exception):
    """An expression failed, or returned the wrong type: never a result."""


@dataclass(frozen=True)
class CompiledExpression:
    """One expression over one variable (``claims`` or ``user``), ready to run."""

    source: str
    variable: str
    ast: Any = field(repr=False, compare=False, hash=False)
    program: Any = field(repr=False, compare=False, hash=False)


def compile_expression(source: str, variable: str) -> CompiledExpression:
    """Parse and check ``source``; :class:`ValueError` says why it is refused."""
    if len(source) > MAX_EXPRESSION_LENGTH:
        raise ValueError(f"longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        ast = _ENVIRONMENT.compile(source)
    except celpy.CELParseError as exc:
        if _OPTIONAL_SYNTAX.search(_STRING_LITERAL.sub("''", source)):
            raise ValueError(OPTIONAL_UNSUPPORTED) from None
        raise ValueError(" ".join(str(exc).split())[:300]) from None
    depth = _comprehension_depth(ast)
    if depth > MAX_COMPREHENSION_DEPTH:
        raise ValueError(f"comprehensions nested {depth} deep (at most {MAX_COMPREHENSION_DEPTH})")
    unknown = _free_identifiers(ast) - {variable}
    if "optional" in unknown:
        raise ValueError(OPTIONAL_UNSUPPORTED)
    if unknown:
        raise ValueError(f"undeclared reference to {sorted(unknown)[0]!r} (only {variable!r} is declared)")
    return CompiledExpression(source, variable, ast, _ENVIRONMENT.program(ast, functions=_STRING_FUNCTIONS))


def evaluate(expression: CompiledExpression, value: Any) -> Any:
    """The expression's result on ``value`` (JSON-shaped), as a plain Python value.

    :raises EvaluationError: the evaluation failed (never a value that could pass for a result).
    """
    if len(json.dumps(value, separators=(",", ":"))) > MAX_INPUT_BYTES:
        raise EvaluationError(f"input larger than {MAX_INPUT_BYTES} bytes")
    try:
        result = expression.program.evaluate({expression.variable: celpy.json_to_cel(value)})
    except celpy.CELEvalError as exc:
        raise EvaluationError(_error_text(exc)) from None
    except CostExceeded as exc:
        raise EvaluationError(f"cost budget exceeded: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, RecursionError) as exc:
        # celpy lets some failures of its built-ins through as Python's own.
        raise EvaluationError(type(exc).__name__) from None
    if isinstance(result, celpy.CELEvalError):
        raise EvaluationError(_error_text(result))
    return _plain(result)


def _error_text(exc: BaseException) -> str:
    first = str(exc.args[0] if exc.args else type(exc).__name__)
    # celpy appends the whole activation (the claims) to some messages: not for a client.
    return " ".join(first.split(" (in activation", 1)[0].split())[:200]


def _string_function(name: str, body: Any) -> Any:
    def call(*args: Any) -> Any:
        try:
            return body(*args)
        except (TypeError, ValueError, AttributeError) as exc:
            return celpy.CELEvalError(f"{name}: {type(exc).__name__}", type(exc), exc.args)
    return call


def _split(text: Any, separator: Any, limit: Any = -1) -> Any:
    if not isinstance(text, str) or not isinstance(separator, str):
        raise TypeError("split")
    count = int(limit)
    if count == 0:
        return celpy.celtypes.ListType([])
    parts = text.split(separator, count - 1) if count > 0 else text.split(separator)
    return celpy.celtypes.ListType([celpy.celtypes.StringType(p) for p in parts])


def _join(items: Any, separator: Any = "") -> Any:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise TypeError("join")
    return celpy.celtypes.StringType(str(separator).join(items))


def _text(operation: Any) -> Any:
    def apply(text: Any, *args: Any) -> Any:
        if not isinstance(text, str) or not all(isinstance(a, str) for a in args):
            raise TypeError("string function")
        return celpy.celtypes.StringType(operation(text, *args))
    return apply


#: The string extension Kubernetes' CEL environment includes (cel-go ``ext.Strings``), the
#: functions claim mappings use: celpy has only the standard library.
_STRING_FUNCTIONS: dict[str, Any] = {
    "split": _string_function("split", _split),
    "join": _string_function("join", _join),
    "lowerAscii": _string_function("lowerAscii", _text(lambda t: "".join(
        c.lower() if c.isascii() else c for c in t))),
    "upperAscii": _string_function("upperAscii", _text(lambda t: "".join(
        c.upper() if c.isascii() else c for c in t))),
    "trim": _string_function("trim", _text(str.strip)),
    "replace": _string_function("replace", _text(lambda t, old, new: t.replace(old, new))),
}


def _plain(value: Any) -> Any:
    """A celpy value as JSON-shaped Python (bool before int: CEL's bool is not a number)."""
    if isinstance(value, celpy.celtypes.BoolType):
        return bool(value)
    if isinstance(value, celpy.celtypes.StringType):
        return str(value)
    if isinstance(value, (celpy.celtypes.IntType, celpy.celtypes.UintType)):
        return int(value)
    if isinstance(value, celpy.celtypes.DoubleType):
        return float(value)
    if isinstance(value, celpy.celtypes.ListType):
        return [_plain(item) for item in value]
    if isinstance(value, celpy.celtypes.MapType):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, celpy.celtypes.NullType):
        return None
    if isinstance(value, celpy.CELEvalError):
        raise EvaluationError(_error_text(value))
    return value


def selects(expression: CompiledExpression, operand: str, name: str) -> bool:
    """Whether ``expression`` reads ``operand.name`` (validation.go ``hasSelectExp``)."""
    for node in expression.ast.iter_subtrees():
        if node.data == "member_dot" and len(node.children) == 2:
            target, field_token = node.children
            if str(field_token) == name and _identifier(target) == operand:
                return True
    return False


def _identifier(node: Any) -> str | None:
    """The identifier a parse-tree node is made of alone, if it is one."""
    while isinstance(node, lark.Tree):
        if node.data == "ident":
            return str(node.children[0])
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return str(node) if isinstance(node, lark.Token) and node.type == "IDENT" else None


def _free_identifiers(ast: Any) -> set[str]:
    """Identifiers an expression reads from its activation (not the variables its macros bind)."""
    bound: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data in ("member_dot_arg",) and len(node.children) >= 2:
            method = str(node.children[1])
            args = node.children[2] if len(node.children) > 2 else None
            if method in _COMPREHENSIONS and isinstance(args, lark.Tree) and args.children:
                name = _identifier(args.children[0])
                if name:
                    bound.add(name)
    found: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data == "ident":
            name = str(node.children[0])
            if name not in bound:
                found.add(name)
    return found


def _comprehension_depth(ast: Any) -> int:
    def depth(node: Any) -> int:
        if not isinstance(node, lark.Tree):
            return 0
        inner = max((depth(child) for child in node.children), default=0)
        if node.data == "member_dot_arg" and len(node.children) >= 2 and str(node.children[1]) in _COMPREHENSIONS:
            return inner + 1
        return inner

    return depth(ast)
