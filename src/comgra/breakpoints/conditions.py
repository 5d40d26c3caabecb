"""The breakpoint condition language: a small, safe expression over a tensor's or a module's metrics.

    >>> condition = parse_condition("grad_norm < 1e-3 and step > 100")
    >>> sorted(condition.names)
    ['grad_norm', 'step']
    >>> condition.evaluate({"grad_norm": 1e-4, "step": 120})
    True

A condition is parsed with the standard library's ``ast`` and every node is checked against a
whitelist (comparisons, ``and``/``or``/``not``, ``+ - * /``, numbers, ``true``/``false`` and the
metric names below). The checked tree is then compiled into nested closures: nothing is ever passed
to ``eval`` or ``exec``, so a string that came over HTTP cannot run code.
"""
from __future__ import annotations

import ast
import difflib
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from comgra.errors import BreakpointError

__all__ = ["Condition", "METRICS", "VALUE_METRICS", "GRADIENT_METRICS", "CONTEXT_METRICS", "parse_condition"]

# Reductions of the target's value (a named tensor, or a module's output).
VALUE_METRICS = ("mean", "abs_mean", "std", "min", "max", "abs_max", "norm", "has_nan", "has_inf")
# Reductions of the target's gradient (a named tensor's .grad, or a module's parameter gradients).
GRADIENT_METRICS = ("grad_norm", "grad_mean", "grad_abs_max", "grad_has_nan")
# Known without touching a tensor.
CONTEXT_METRICS = ("step", "iteration", "execution_time")
METRICS = VALUE_METRICS + GRADIENT_METRICS + CONTEXT_METRICS
MAX_LENGTH = 500

_COMPARE: dict[type, Callable[[float, float], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_CONSTANTS = {"true": True, "false": False, "True": True, "False": False, "inf": math.inf, "nan": math.nan}
_VALID = ("numbers, the metrics " + ", ".join(METRICS) + ", true/false, comparisons (< <= > >= == !=), "
          "and/or/not, + - * / and parentheses")

Evaluator = Callable[[Mapping[str, float]], float]


def _safe_div(left: float, right: float) -> float:
    """Division that never raises: x/0 is inf (or nan for 0/0), as the reductions would give."""
    if right == 0:
        return math.nan if left == 0 or math.isnan(left) else math.copysign(math.inf, left)
    return left / right


_ARITHMETIC: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: _safe_div}


@dataclass(frozen=True)
class Condition:
    """A checked condition: its text, the metrics it reads, and a function of those metrics."""

    text: str
    names: frozenset[str]
    _evaluate: Evaluator

    def evaluate(self, metrics: Mapping[str, float]) -> bool:
        """True when the condition holds. A metric that is NaN makes each comparison with it false."""
        return bool(self._evaluate(metrics))

    @property
    def value_metrics(self) -> tuple[str, ...]:
        return tuple(name for name in VALUE_METRICS if name in self.names)

    @property
    def gradient_metrics(self) -> tuple[str, ...]:
        return tuple(name for name in GRADIENT_METRICS if name in self.names)


def parse_condition(text: object) -> Condition:
    """Parse and check ``text``; raise BreakpointError (field ``condition``) naming the bad token."""
    if not isinstance(text, str):
        raise BreakpointError(f"condition={text!r} must be a string such as 'abs_max > 1e4'.", field="condition")
    if not text.strip():
        raise BreakpointError("condition is empty; write an expression such as 'has_nan' or 'abs_max > 1e4'. "
                              f"Valid: {_VALID}.", field="condition")
    if len(text) > MAX_LENGTH:
        raise BreakpointError(f"condition is {len(text)} characters long; at most {MAX_LENGTH} are allowed.",
                              field="condition")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        where = f" at column {error.offset}" if isinstance(error, SyntaxError) and error.offset else ""
        raise BreakpointError(f"condition {text!r} is not a valid expression{where}. Valid: {_VALID}; "
                              "e.g. 'grad_norm < 1e-3 and step > 100'.", field="condition") from None
    names: set[str] = set()
    try:
        evaluate = _compile(tree.body, text, names)
    except RecursionError:
        raise BreakpointError(f"condition {text[:40]!r}... nests too deeply; simplify it.", field="condition") from None
    return Condition(text, frozenset(names), evaluate)


def _compile(node: ast.AST, text: str, names: set[str]) -> Evaluator:
    """Turn one whitelisted node into a closure; any other node is an error naming its source text."""
    if isinstance(node, ast.BoolOp):
        parts = [_compile(value, text, names) for value in node.values]
        if len(parts) == 2:  # the common case, without a generator per evaluation
            first, second = parts
            if isinstance(node.op, ast.And):
                return lambda m: first(m) and second(m)
            return lambda m: first(m) or second(m)
        if isinstance(node.op, ast.And):
            return lambda m: all(part(m) for part in parts)
        return lambda m: any(part(m) for part in parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        inner = _compile(node.operand, text, names)
        if isinstance(node.op, ast.Not):
            return lambda m: not inner(m)
        if isinstance(node.op, ast.USub):
            return lambda m: -inner(m)
        return inner
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        return _compile_comparison(node, text, names)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right, apply = _compile(node.left, text, names), _compile(node.right, text, names), _ARITHMETIC[type(node.op)]
        return lambda m: apply(left(m), right(m))
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        try:
            value = float(node.value)  # type: ignore[arg-type]  # checked just above
        except OverflowError:
            raise BreakpointError(f"condition {text[:60]!r}: the number {_token(node, text)[:40]}... is too large "
                                  "for a float; write it as e.g. 1e300.", field="condition") from None
        return lambda m: value
    if isinstance(node, ast.Name):
        return _compile_name(node.id)(names)
    raise BreakpointError(f"condition {text!r}: {_token(node, text)!r} is not allowed. Valid: {_VALID}.",
                          field="condition")


def _compile_comparison(node: ast.Compare, text: str, names: set[str]) -> Evaluator:
    operands = [_compile(node.left, text, names)] + [_compile(c, text, names) for c in node.comparators]
    tests = [_COMPARE[type(op)] for op in node.ops]
    if len(tests) == 1:  # "metric > number": one call of the test on a dict lookup and a constant
        test, (left, right) = tests[0], operands
        if isinstance(node.left, ast.Name) and node.left.id in names and isinstance(node.comparators[0], ast.Constant):
            name, constant = node.left.id, right({})
            return lambda m: test(m[name], constant)
        return lambda m: test(left(m), right(m))

    def compare(m: Mapping[str, float]) -> bool:
        left = operands[0](m)
        for test, operand in zip(tests, operands[1:]):
            right = operand(m)
            if not test(left, right):
                return False
            left = right
        return True
    return compare


def _compile_name(name: str) -> Callable[[set[str]], Evaluator]:
    def bind(names: set[str]) -> Evaluator:
        if name in _CONSTANTS:
            constant = _CONSTANTS[name]
            return lambda m: constant
        if name not in METRICS:
            close = difflib.get_close_matches(name, METRICS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise BreakpointError(f"condition: unknown name {name!r}{hint} Valid: {_VALID}.", field="condition")
        names.add(name)
        return lambda m: m[name]
    return bind


def _token(node: ast.AST, text: str) -> str:
    """The source text of a rejected node (what the user typed), or its kind when that is unknown."""
    segment = ast.get_source_segment(text.strip(), node)
    return segment if segment else type(node).__name__
