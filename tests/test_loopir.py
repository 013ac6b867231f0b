"""The loop IR's builders: constant folding, dtypes, index helpers and loop nests (pure Python, no LLVM)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from farm.ir import loopir as L

# -- a tiny evaluator for integer index expressions, with the renderer's C-like (truncating) division ---------------


def _trunc_div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


INT_OPS = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": _trunc_div,
    "mod": lambda x, y: x - y * _trunc_div(x, y),
    "max": max,
    "min": min,
}


def evaluate(expr: L.Expr, env: dict[str, int]) -> int:
    if isinstance(expr, L.Const):
        return expr.value
    if isinstance(expr, L.Var):
        return env[expr.name]
    if isinstance(expr, L.Binary):
        return INT_OPS[expr.op](evaluate(expr.lhs, env), evaluate(expr.rhs, env))
    raise TypeError(f"cannot evaluate {expr!r}")


def variables(expr: L.Expr) -> set[str]:
    """Names of the Vars an expression reads."""
    if isinstance(expr, L.Var):
        return {expr.name}
    if isinstance(expr, L.Binary):
        return variables(expr.lhs) | variables(expr.rhs)
    if isinstance(expr, (L.Cast, L.Call)):
        return variables(expr.arg)
    if isinstance(expr, L.Select):
        return variables(expr.cond) | variables(expr.if_true) | variables(expr.if_false)
    if isinstance(expr, L.Load):
        return variables(expr.index)
    return set()


def is_const(expr: L.Expr, value, dtype: str) -> bool:
    return isinstance(expr, L.Const) and expr.dtype == dtype and expr.value == value and type(expr.value) is type(value)


# -- constants and wrapping ----------------------------------------------------------------------------------------


def test_const_defaults_ints_to_i64_and_floats_to_f32():
    assert is_const(L.const(3), 3, L.I64)
    assert is_const(L.const(2.5), 2.5, L.F32)
    assert is_const(L.const(3, L.F32), 3, L.F32)


def test_wrap_turns_numbers_into_constants_of_the_given_dtype():
    assert is_const(L.wrap(3), 3.0, L.F32)
    assert is_const(L.wrap(3, L.I64), 3, L.I64)
    assert is_const(L.wrap(2.0, L.I64), 2, L.I64)
    x = L.Load("in", L.Var("i"))
    assert L.wrap(x) is x
    assert L.wrap(x, L.I64) is x


# -- constant folding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda v: v + 0,
        lambda v: 0 + v,
        lambda v: v - 0,
        lambda v: v * 1,
        lambda v: 1 * v,
        lambda v: v // 1,
        lambda v: L.binary("add", v, L.const(0)),
        lambda v: L.binary("mul", L.const(1), v),
    ],
    ids=["x+0", "0+x", "x-0", "x*1", "1*x", "x//1", "binary(x,const0)", "binary(const1,x)"],
)
def test_integer_identities_fold_to_the_operand_itself(build):
    v = L.Var("i")
    assert build(v) is v


@pytest.mark.parametrize(
    "build", [lambda v: v * 0, lambda v: 0 * v, lambda v: L.binary("mul", v, L.const(0))], ids=["x*0", "0*x", "binary"]
)
def test_integer_times_zero_folds_to_a_zero_constant(build):
    assert is_const(build(L.Var("i")), 0, L.I64)


@pytest.mark.parametrize(
    "op, a, b, expected",
    [
        ("add", 3, 4, 7),
        ("sub", 2, 5, -3),
        ("mul", 6, 7, 42),
        ("div", 7, 2, 3),
        ("mod", 7, 3, 1),
        ("div", 12, 4, 3),
        ("mod", 12, 4, 0),
    ],
)
def test_integer_constant_arithmetic_folds(op, a, b, expected):
    assert is_const(L.binary(op, L.const(a), L.const(b)), expected, L.I64)
    assert is_const(L.binary(op, L.const(a), b), expected, L.I64)
    assert is_const(L.binary(op, a, L.const(b)), expected, L.I64)


def test_operators_fold_nested_constant_index_math():
    # (2 * 3 + 4) * 5 - 1: all constant, so one Const
    assert is_const((L.const(2) * 3 + 4) * 5 - 1, 49, L.I64)
    # i * 1 + 0 stays i, and (i + 0) * 0 becomes 0
    i = L.Var("i")
    assert i * 1 + 0 is i
    assert is_const((i + 0) * 0, 0, L.I64)


def test_negating_an_integer_constant_folds():
    assert is_const(-L.const(5), -5, L.I64)


def test_non_identity_integer_expressions_are_not_folded():
    i = L.Var("i")
    for expr, op in (
        (i + 2, "add"),
        (i * 3, "mul"),
        (i - 1, "sub"),
        (i // 2, "div"),
        (i % 3, "mod"),
        (2 - i, "sub"),
        (0 - i, "sub"),
    ):
        assert isinstance(expr, L.Binary) and expr.op == op and expr.dtype == L.I64


def test_float_arithmetic_is_never_folded():
    """x*0, x+0 and x*1 on floats are not identities under IEEE (NaN, inf, -0.0); and constants stay separate."""
    x = L.Load("in", L.Var("i"))
    for expr in (x * 0.0, x + 0.0, x * 1.0, 0.0 * x, L.const(1.0) + L.const(2.0), x * 0):
        assert isinstance(expr, L.Binary)
        assert expr.dtype == L.F32


def test_python_numbers_take_the_dtype_of_the_expression_they_meet():
    x = L.Load("in", L.Var("i"))
    right, left = x + 1, 2 * x
    assert is_const(right.rhs, 1.0, L.F32) and right.dtype == L.F32
    assert is_const(left.lhs, 2.0, L.F32) and left.dtype == L.F32
    i = L.Var("i")
    index = i + 2
    assert is_const(index.rhs, 2, L.I64) and index.dtype == L.I64
    assert L.binary("add", 1, 2).dtype == L.F32  # two numbers: float


def test_reflected_operators_keep_operand_order():
    x = L.Load("in", L.Var("i"))
    for expr, op in ((1 - x, "sub"), (1 / x, "div"), (1 + x, "add"), (3 * x, "mul")):
        assert expr.op == op
        assert is_const(expr.lhs, float(expr.lhs.value), L.F32)
        assert expr.rhs is x


def test_negating_a_float_is_zero_minus_it():
    x = L.Load("in", L.Var("i"))
    neg = -x
    assert neg.op == "sub" and is_const(neg.lhs, 0.0, L.F32) and neg.rhs is x and neg.dtype == L.F32


# -- dtypes ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(L.COMPARISONS))
def test_comparisons_are_bool_for_float_and_integer_operands(op):
    x, i = L.Load("in", L.Var("i")), L.Var("i")
    for lhs, rhs in ((x, 0.0), (x, 1), (i, 3), (i, L.Var("j")), (L.const(1), L.const(2))):
        cond = L.compare(op, lhs, rhs)
        assert isinstance(cond, L.Binary) and cond.op == op
        assert cond.dtype == L.BOOL
        assert cond.lhs.dtype == cond.rhs.dtype  # the operands agree, whatever the result


def test_logical_and_chains_bools():
    a, b, c = (L.compare("lt", L.Var(n), 3) for n in "abc")
    assert L.logical_and(a) is a
    both = L.logical_and(a, b, c)
    assert both.op == "and" and both.dtype == L.BOOL
    assert both.rhs is c and both.lhs.op == "and" and both.lhs.lhs is a and both.lhs.rhs is b


def test_max_min_keep_the_operand_dtype():
    x, i = L.Load("in", L.Var("i")), L.Var("i")
    assert L.maximum(x, 0.0).dtype == L.F32 and L.maximum(x, 0.0).op == "max"
    assert L.minimum(i, 4).dtype == L.I64 and is_const(L.minimum(i, 4).rhs, 4, L.I64)


@pytest.mark.parametrize("op", sorted(L.BITWISE))
def test_bit_operations_are_i64_and_never_folded(op):
    i = L.Var("i")
    expr = L.binary(op, i, 3)
    assert isinstance(expr, L.Binary) and expr.op == op and expr.dtype == L.I64 and is_const(expr.rhs, 3, L.I64)
    folded = L.binary(op, L.const(6), L.const(3))
    assert isinstance(folded, L.Binary)  # constants stay: only add sub mul div mod fold


@pytest.mark.parametrize("op", sorted(L.BITWISE))
def test_bit_operations_refuse_float_and_bool_operands(op):
    with pytest.raises(ValueError, match=f"{op} takes I64 operands"):
        L.binary(op, L.Load("in", L.Var("i")), 1.0)
    with pytest.raises(ValueError, match=f"{op} takes I64 operands"):
        L.binary(op, L.compare("lt", L.Var("i"), 3), L.compare("gt", L.Var("i"), 1))


def test_select_takes_its_dtype_from_the_branches():
    cond = L.compare("gt", L.Var("i"), 2)
    x, i = L.Load("in", L.Var("i")), L.Var("j")
    s = L.select(cond, 1, x)  # number then float expr
    assert s.dtype == L.F32 and is_const(s.if_true, 1.0, L.F32) and s.if_false is x
    s = L.select(cond, i, 0)  # int expr then number
    assert s.dtype == L.I64 and s.if_true is i and is_const(s.if_false, 0, L.I64)
    s = L.select(cond, 0, i)  # number then int expr
    assert s.dtype == L.I64 and is_const(s.if_true, 0, L.I64)
    s = L.select(cond, 1, 2)  # two numbers: float
    assert s.dtype == L.F32 and is_const(s.if_true, 1.0, L.F32) and is_const(s.if_false, 2.0, L.F32)
    assert s.cond is cond


def test_call_and_to_float_are_f32():
    i = L.Var("i")
    assert L.call("exp", L.Load("in", i)).dtype == L.F32
    cast = L.to_float(i)
    assert isinstance(cast, L.Cast) and cast.dtype == L.F32 and cast.arg is i


def test_names_are_fresh():
    names = L.Names()
    made = [names.var(), names.var("j"), names.local(), names.local("m", L.I64), names.var()]
    assert len({v.name for v in made}) == len(made)
    assert [v.dtype for v in made] == [L.I64, L.I64, L.F32, L.I64, L.I64]


# -- index helpers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (1, 1), (3, 1, 2), (7, 1, 1, 6)])
def test_strides_of_matches_numpy(shape):
    expected = tuple(s // 4 for s in np.zeros(shape, np.float32).strides)
    assert L.strides_of(shape) == expected


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (3, 1, 2), (2, 2, 1, 3)])
def test_flat_index_is_row_major(shape):
    vars_ = [L.Var(f"v{axis}") for axis in range(len(shape))]
    index = L.flat_index(shape, vars_)
    assert index.dtype == L.I64
    for position in itertools.product(*(range(d) for d in shape)):
        env = {v.name: p for v, p in zip(vars_, position)}
        assert evaluate(index, env) == np.ravel_multi_index(position, shape)


def test_flat_index_folds_away_unit_strides_and_constants():
    i = L.Var("i")
    assert L.flat_index((5,), [i]) is i
    assert is_const(L.flat_index((2, 3, 4), [1, 2, 3]), 23, L.I64)
    assert is_const(L.flat_index((), []), 0, L.I64)
    # a constant 0 on an axis contributes nothing: no term for it
    assert variables(L.flat_index((4, 6), [0, i])) == {"i"}


@pytest.mark.parametrize(
    "in_shape, out_shape",
    [
        ((3, 4), (3, 4)),
        ((4,), (2, 3, 4)),
        ((3, 1), (2, 3, 4)),
        ((1, 4), (3, 4)),
        ((1,), (2, 5)),
        ((), (2, 3)),
        ((2, 1, 4), (2, 3, 4)),
        ((1, 3, 1), (2, 1, 3, 5)),
    ],
)
def test_broadcast_index_matches_numpy_broadcasting(in_shape, out_shape):
    out_vars = [L.Var(f"o{axis}") for axis in range(len(out_shape))]
    index = L.broadcast_index(in_shape, out_shape, out_vars)
    flat = np.arange(int(np.prod(in_shape)), dtype=np.int64).reshape(in_shape)
    expected = np.broadcast_to(flat, out_shape)
    for position in itertools.product(*(range(d) for d in out_shape)):
        env = {v.name: p for v, p in zip(out_vars, position)}
        assert evaluate(index, env) == expected[position]


def test_broadcast_index_drops_leading_dims_and_size_one_dims():
    out_vars = [L.Var(f"o{axis}") for axis in range(4)]
    # in (3, 1) against out (2, 5, 3, 7): o0, o1 are leading dims; o3 meets a size-1 dim
    assert variables(L.broadcast_index((3, 1), (2, 5, 3, 7), out_vars)) == {"o2"}
    assert variables(L.broadcast_index((1, 7), (2, 5, 3, 7), out_vars)) == {"o3"}
    assert variables(L.broadcast_index((5, 3, 7), (2, 5, 3, 7), out_vars)) == {"o1", "o2", "o3"}
    assert is_const(L.broadcast_index((1, 1), (2, 5, 3, 7), out_vars), 0, L.I64)
    assert is_const(L.broadcast_index((), (2, 5, 3, 7), out_vars), 0, L.I64)
    # the innermost kept axis has stride 1: no multiplication left
    assert L.broadcast_index((7,), (2, 5, 3, 7), out_vars) is out_vars[3]


# -- loop nests --------------------------------------------------------------------------------------------------------


def test_loop_nest_builds_nested_loops_with_the_given_extents():
    names = L.Names()
    seen = {}

    def body(vars_):
        seen["vars"] = vars_
        return [L.Store("out", L.flat_index((2, 3, 4), vars_), L.const(1.0))]

    stmts, loop_vars = L.loop_nest(names, (2, 3, 4), body)
    assert loop_vars == seen["vars"] and len({v.name for v in loop_vars}) == 3
    extents, level = [], stmts
    for var in loop_vars:
        assert len(level) == 1 and isinstance(level[0], L.Loop)
        assert level[0].var is var
        extents.append(level[0].extent)
        level = level[0].body
    assert extents == [2, 3, 4]
    assert len(level) == 1 and isinstance(level[0], L.Store)


def test_loop_nest_of_a_scalar_is_the_body_itself():
    store = L.Store("out", L.const(0), L.const(1.0))
    stmts, loop_vars = L.loop_nest(L.Names(), (), lambda vars_: [store])
    assert stmts == [store] and loop_vars == []


def test_loop_nest_variables_are_fresh_across_nests():
    names = L.Names()
    _, first = L.loop_nest(names, (2, 2), lambda v: [])
    _, second = L.loop_nest(names, (2, 2), lambda v: [])
    assert not {v.name for v in first} & {v.name for v in second}
