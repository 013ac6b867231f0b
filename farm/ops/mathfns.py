"""Math functions as loop-IR expressions, built from what every renderer provides: arithmetic, comparisons, selects
and the calls exp, log, sqrt and floor.

Accuracy is float32's (a few ulp of the reduced argument), and NaN propagates wherever C's libm propagates it.
Functions that use a value several times bind it to a local first (`Scope.bind`): the renderers emit an expression
tree once per reference, so nested functions would otherwise grow exponentially.
"""

from __future__ import annotations

import math

from farm.ir import loopir as L

FALSE = L.Const(0, L.BOOL)
INF = math.inf


class Scope:
    """The statements that compute one element's intermediate values, in order, before its store."""

    def __init__(self, names: L.Names) -> None:
        self.names = names
        self.stmts: list[L.Stmt] = []

    def bind(self, value: L.Expr, hint: str = "t") -> L.Expr:
        """`value` held in a fresh local (constants and variables are returned as they are)."""
        if isinstance(value, (L.Const, L.Var)):
            return value
        local = self.names.local(hint, value.dtype)
        self.stmts.append(L.Assign(local, value))
        return local


# --------------------------------------------------------------------------------------------- predicates


def logical_not(cond: L.Expr) -> L.Expr:
    return L.compare("eq", cond, FALSE)


def logical_or(a: L.Expr, b: L.Expr) -> L.Expr:
    return L.binary("or", a, b)


def is_nan(x: L.Expr) -> L.Expr:
    """x != x, written as not (x == x): the renderers' float comparisons are ordered, so NaN == NaN is false."""
    return logical_not(L.compare("eq", x, x))


def is_inf(s: Scope, x: L.Expr) -> L.Expr:
    return L.compare("eq", absolute(s, x), INF)


def is_finite(s: Scope, x: L.Expr) -> L.Expr:
    return L.compare("lt", absolute(s, x), INF)


def nonzero(x: L.Expr) -> L.Expr:
    """x != 0 for any dtype, true for NaN (as a cast to bool is)."""
    return x if x.dtype == L.BOOL else logical_not(L.compare("eq", x, 0))


# ------------------------------------------------------------------------------------------------- basics


def absolute(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    return L.select(L.compare("lt", x, 0), -x, x)


def sign(s: Scope, x: L.Expr) -> L.Expr:
    """-1, 0 or 1 in x's dtype; NaN stays NaN."""
    x = s.bind(x)
    return L.select(L.compare("gt", x, 0), 1, L.select(L.compare("lt", x, 0), -1, x))


def ceil(x: L.Expr) -> L.Expr:
    return -L.call("floor", -x)


def trunc(s: Scope, x: L.Expr) -> L.Expr:
    """Round toward zero."""
    x = s.bind(x)
    return L.select(L.compare("lt", x, 0.0), ceil(x), L.call("floor", x))


def is_odd_integer(s: Scope, x: L.Expr) -> L.Expr:
    """Whether float x is an odd integer (x - 2 floor(x / 2) is exact)."""
    x = s.bind(x)
    return L.compare("eq", x - 2.0 * L.call("floor", x * 0.5), 1.0)


def round_half_even(s: Scope, x: L.Expr) -> L.Expr:
    """Nearest integer, ties to even. x - floor(x) is exact, so no tie is misjudged (unlike floor(x + 0.5))."""
    below = s.bind(L.call("floor", x))
    fraction = s.bind(x - below)
    tie_to_odd = L.logical_and(L.compare("eq", fraction, 0.5), is_odd_integer(s, below))
    return L.select(logical_or(L.compare("gt", fraction, 0.5), tie_to_odd), below + 1.0, below)


# -------------------------------------------------------------------------------------- exponential family


def sigmoid(x: L.Expr) -> L.Expr:
    return 1.0 / (1.0 + L.call("exp", -x))


def tanh(s: Scope, x: L.Expr) -> L.Expr:
    """tanh from one exp of a non-positive argument, so that it never overflows."""
    x = s.bind(x)
    t = s.bind(L.call("exp", -2.0 * absolute(s, x)))
    magnitude = s.bind((1.0 - t) / (1.0 + t))
    return L.select(L.compare("lt", x, 0.0), -magnitude, magnitude)


def softplus(s: Scope, x: L.Expr) -> L.Expr:
    """log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): no overflow for large x."""
    x = s.bind(x)
    return L.maximum(x, 0.0) + L.call("log", 1.0 + L.call("exp", -absolute(s, x)))


def expm1(x: L.Expr) -> L.Expr:
    """exp(x) - 1 (absolute accuracy, which is what the activations built on it need)."""
    return L.call("exp", x) - 1.0


# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7 over the whole real line.
_ERF_P = 0.3275911
_ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def erf(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    a = s.bind(absolute(s, x))
    t = s.bind(1.0 / (1.0 + _ERF_P * a))
    y = s.bind(1.0 - t * horner(t, _ERF_A) * L.call("exp", -(a * a)))
    return L.select(L.compare("lt", x, 0.0), -y, y)


def horner(x: L.Expr, coefficients: tuple[float, ...]) -> L.Expr:
    """The polynomial with `coefficients` (highest degree first) at x."""
    result: L.Expr = L.const(coefficients[0])
    for c in coefficients[1:]:
        result = result * x + c
    return result


# ---------------------------------------------------------------------------------------------- powers


def power(s: Scope, x: L.Expr, y: L.Expr) -> L.Expr:
    """C's powf for float x and y: exp(y log|x|), negative x only to integer powers (sign by parity), pow(x, 0)
    = pow(1, y) = pow(-1, +-inf) = 1 even for NaN."""
    x, y = s.bind(x), s.bind(y)
    magnitude = s.bind(L.call("exp", y * L.call("log", absolute(s, x))))
    whole = s.bind(L.compare("eq", L.call("floor", y), y))
    negative = L.select(whole, L.select(is_odd_integer(s, y), -magnitude, magnitude), math.nan)
    value = L.select(L.compare("lt", x, 0.0), negative, magnitude)
    minus_one_to_inf = L.logical_and(L.compare("eq", x, -1.0), is_inf(s, y))
    one = logical_or(logical_or(L.compare("eq", y, 0.0), L.compare("eq", x, 1.0)), minus_one_to_inf)
    return L.select(one, 1.0, value)


def integer_power(s: Scope, x: L.Expr, exponent: int) -> L.Expr:
    """x ** exponent for a constant integer exponent: square-and-multiply (a reciprocal for negative ones)."""
    x = s.bind(x)
    result: L.Expr = L.const(1.0)
    base, n = x, abs(exponent)
    while n:
        if n & 1:
            result = base if isinstance(result, L.Const) else s.bind(result * base)
        n >>= 1
        if n:
            base = s.bind(base * base)
    return 1.0 / result if exponent < 0 else result


# Exponent bits an int64 power can use without overflowing for |x| >= 2; larger exponents keep their parity.
_INT_POWER_BITS = 6


def int_power(s: Scope, x: L.Expr, y: L.Expr) -> L.Expr:
    """x ** y for int64 x and y, exact where it doesn't overflow (square-and-multiply over y's low bits).
    Negative y: 1 ** y = 1, (-1) ** y = +-1, otherwise 0 (the integer part of 1 / x ** -y)."""
    x, y = s.bind(x), s.bind(y)
    limit = 2**_INT_POWER_BITS - 1
    exponent = s.bind(L.select(L.compare("gt", y, limit), (limit - 1) + y % 2, y))
    result: L.Expr = L.const(1)
    base = x
    for bit in range(_INT_POWER_BITS):
        is_set = L.compare("eq", (exponent / 2**bit) % 2, 1)
        result = s.bind(L.select(is_set, result * base, result))
        if bit + 1 < _INT_POWER_BITS:
            base = s.bind(base * base)
    minus_one = L.select(L.compare("eq", y % 2, 0), L.const(1), L.const(-1))
    reciprocal = L.select(L.compare("eq", x, 1), 1, L.select(L.compare("eq", x, -1), minus_one, 0))
    return L.select(L.compare("lt", y, 0), reciprocal, result)


# ----------------------------------------------------------------------------------------- trigonometry

# pi/2 in two parts (Cody-Waite): the first has 8 significant bits, so n * part is exact for |n| < 2^16.
_PIO2_HIGH = 1.5703125
_PIO2_LOW = math.pi / 2 - _PIO2_HIGH
# Cephes sinf/cosf minimax polynomials on [-pi/4, pi/4].
_SIN_POLY = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COS_POLY = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)


def _reduce_quarter_turns(s: Scope, x: L.Expr) -> tuple[L.Expr, L.Expr]:
    """(r, q) with x = r + n pi/2, |r| <= pi/4 and q = n mod 4 (as a float 0..3).

    The low part multiplies a copy of n that LLVM can't prove equal to n (NaN maps to 0 there, and x is then
    NaN anyway): with the reassociation the float math allows, x - n a - n b would otherwise become
    x - n (a + b), and the rounding of a + b costs 3e-8 per quarter turn.
    """
    n = s.bind(L.call("floor", x * (2.0 / math.pi) + 0.5))
    opaque_n = L.select(is_nan(n), 0.0, n)
    r = s.bind((x - n * _PIO2_HIGH) - opaque_n * _PIO2_LOW)
    q = s.bind(n - 4.0 * L.call("floor", n * 0.25))
    return r, q


def _sin_cos_reduced(s: Scope, r: L.Expr) -> tuple[L.Expr, L.Expr]:
    z = s.bind(r * r)
    sin_r = s.bind(r + r * z * horner(z, _SIN_POLY))
    cos_r = s.bind(1.0 - 0.5 * z + z * z * horner(z, _COS_POLY))
    return sin_r, cos_r


def _by_quadrant(q: L.Expr, values: tuple[L.Expr, L.Expr, L.Expr, L.Expr]) -> L.Expr:
    """values[q] for q in 0..3 (the last one for NaN, so that it propagates)."""
    return L.select(
        L.compare("eq", q, 0.0),
        values[0],
        L.select(L.compare("eq", q, 1.0), values[1], L.select(L.compare("eq", q, 2.0), values[2], values[3])),
    )


def sin(s: Scope, x: L.Expr) -> L.Expr:
    r, q = _reduce_quarter_turns(s, x)
    sin_r, cos_r = _sin_cos_reduced(s, r)
    return _by_quadrant(q, (sin_r, cos_r, -sin_r, -cos_r))


def cos(s: Scope, x: L.Expr) -> L.Expr:
    r, q = _reduce_quarter_turns(s, x)
    sin_r, cos_r = _sin_cos_reduced(s, r)
    return _by_quadrant(q, (cos_r, -sin_r, -cos_r, sin_r))


def tan(s: Scope, x: L.Expr) -> L.Expr:
    r, q = _reduce_quarter_turns(s, x)
    sin_r, cos_r = _sin_cos_reduced(s, r)
    odd = logical_or(L.compare("eq", q, 1.0), L.compare("eq", q, 3.0))
    return L.select(odd, -cos_r / sin_r, sin_r / cos_r)


# Cephes atanf: arguments above tan(3 pi / 8) use atan(x) = pi/2 - atan(1/x), above tan(pi / 8) pi/4 + atan((x-1)/(x+1)).
_TAN_3PI_8, _TAN_PI_8 = 2.414213562373095, 0.4142135623730950
_ATAN_POLY = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)


def atan(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    a = s.bind(absolute(s, x))
    big, middle = s.bind(L.compare("gt", a, _TAN_3PI_8)), s.bind(L.compare("gt", a, _TAN_PI_8))
    offset = L.select(big, math.pi / 2, L.select(middle, math.pi / 4, 0.0))
    w = s.bind(L.select(big, -1.0 / a, L.select(middle, (a - 1.0) / (a + 1.0), a)))
    z = s.bind(w * w)
    result = s.bind(offset + (horner(z, _ATAN_POLY) * z * w + w))
    return L.select(L.compare("lt", x, 0.0), -result, result)


# ---------------------------------------------------------------------------------------------- remainders


def fmod(s: Scope, x: L.Expr, y: L.Expr) -> L.Expr:
    """C's fmod for floats: x - trunc(x / y) y, the sign of x; fmod(finite, +-inf) = x, NaN for y = 0 or x
    infinite. A quotient that rounded across an integer (x / y may also be x * (1 / y) under fast math) leaves r
    with the wrong sign or |r| >= |y|: one |y| step corrects it."""
    x, y = s.bind(x), s.bind(y)
    r = s.bind(x - trunc(s, x / y) * y)
    step = s.bind(L.select(L.compare("lt", x, 0.0), -absolute(s, y), absolute(s, y)))
    too_far = L.compare("ge", absolute(s, r), absolute(s, y))
    r = s.bind(L.select(L.compare("lt", r * x, 0.0), r + step, L.select(too_far, r - step, r)))
    return L.select(L.logical_and(is_inf(s, y), is_finite(s, x)), x, r)


def floor_mod(s: Scope, x: L.Expr, y: L.Expr) -> L.Expr:
    """numpy's mod for floats: the remainder with the sign of the divisor."""
    y = s.bind(y)
    r = s.bind(fmod(s, x, y))
    differ = L.compare("ne", L.compare("lt", r, 0.0), L.compare("lt", y, 0.0))
    return L.select(L.logical_and(logical_not(L.compare("eq", r, 0.0)), differ), r + y, r)


# ------------------------------------------------------------------------------------- inverse trigonometry

# Cephes asinf: asin(w) = w + w z P(z), z = w^2, for |w| <= 1/2; larger arguments go through the half-angle
# identity asin(a) = pi/2 - 2 asin(sqrt((1 - a) / 2)), whose 1 - a is exact there (Sterbenz).
_ASIN_POLY = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)


def _asin_small(s: Scope, w: L.Expr) -> L.Expr:
    """asin(w) for |w| <= 1/2."""
    w = s.bind(w)
    z = s.bind(w * w)
    return s.bind(w + w * z * horner(z, _ASIN_POLY))


def _half_angle(s: Scope, x: L.Expr) -> tuple[L.Expr, L.Expr]:
    """(big, w): whether |x| > 1/2, and w = sqrt((1 - |x|) / 2) there, x itself elsewhere. |x| > 1 gives a NaN w
    (the square root of a negative number), and NaN stays NaN (it is not big)."""
    big = s.bind(L.compare("gt", absolute(s, x), 0.5))
    return big, s.bind(L.select(big, L.call("sqrt", 0.5 * (1.0 - absolute(s, x))), x))


def asin(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    big, w = _half_angle(s, x)
    p = _asin_small(s, w)
    magnitude = s.bind(math.pi / 2 - 2.0 * p)
    return L.select(big, L.select(L.compare("lt", x, 0.0), -magnitude, magnitude), p)


def acos(s: Scope, x: L.Expr) -> L.Expr:
    """acos(x) = pi/2 - asin(x) for |x| <= 1/2; 2 asin(sqrt((1 - |x|) / 2)) (or pi less it for negative x) beyond,
    so that acos near 1 keeps float32's relative accuracy."""
    x = s.bind(x)
    big, w = _half_angle(s, x)
    p = _asin_small(s, w)
    outer = L.select(L.compare("lt", x, 0.0), math.pi - 2.0 * p, 2.0 * p)
    return L.select(big, outer, math.pi / 2 - p)


# ------------------------------------------------------------------------------------------------ hyperbolic

# exp(a) for a above this is computed as exp(a - _EXP_SHIFT) * exp(_EXP_SHIFT): exp(89) overflows float32 while
# sinh(89) and cosh(89) (half of it) don't. a - 80 is exact for the a where the result is finite.
_EXP_SHIFT = 80.0
_HALF_EXP_SHIFT = 0.5 * math.exp(_EXP_SHIFT)
# Cephes sinhf on |x| <= 1 (where exp(x) - exp(-x) would cancel): x + x z P(z), z = x^2.
_SINH_POLY = (2.03721912945e-4, 8.33028376239e-3, 1.66667160211e-1)


def _half_exp(s: Scope, a: L.Expr) -> L.Expr:
    """exp(a) / 2 for a >= 0, finite wherever the result is."""
    a = s.bind(a)
    shifted = s.bind(L.compare("gt", a, _EXP_SHIFT))
    e = s.bind(L.call("exp", L.select(shifted, a - _EXP_SHIFT, a)))
    return s.bind(L.select(shifted, e * _HALF_EXP_SHIFT, 0.5 * e))


def sinh(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    a = s.bind(absolute(s, x))
    half = _half_exp(s, a)
    z = s.bind(x * x)
    small = x + x * z * horner(z, _SINH_POLY)
    magnitude = s.bind(half - 0.25 / half)
    large = L.select(L.compare("lt", x, 0.0), -magnitude, magnitude)
    return L.select(L.compare("le", a, 1.0), small, large)


def cosh(s: Scope, x: L.Expr) -> L.Expr:
    """(exp(|x|) + exp(-|x|)) / 2: no cancellation, and no overflow before the result's."""
    half = _half_exp(s, absolute(s, x))
    return half + 0.25 / half


# Cephes asinhf (|x| < 1/2) and acoshf (x - 1 < 1/2) polynomials; above _LOG_ONLY, asinh and acosh are
# log(2x) = log(x) + log 2 (x^2 would overflow, and the +-1 under the root is below float32's resolution).
_ASINH_POLY = (2.0122003309e-2, -4.2699340972e-2, 7.4847586088e-2, -1.6666288134e-1)
_ACOSH_POLY = (1.7596881071e-3, -7.5272886713e-3, 2.6454905019e-2, -1.1784741703e-1, 1.4142135263e0)
_LOG_ONLY = 1500.0
_LN2 = math.log(2.0)


def asinh(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    a = s.bind(absolute(s, x))
    z = s.bind(x * x)
    small = x + x * z * horner(z, _ASINH_POLY)
    log_form = L.select(
        L.compare("gt", a, _LOG_ONLY), L.call("log", a) + _LN2, L.call("log", a + L.call("sqrt", z + 1.0))
    )
    magnitude = s.bind(log_form)
    large = L.select(L.compare("lt", x, 0.0), -magnitude, magnitude)
    return L.select(L.compare("lt", a, 0.5), small, large)


def acosh(s: Scope, x: L.Expr) -> L.Expr:
    """NaN below 1; near 1, sqrt(x - 1) times a polynomial (x - 1 is exact there)."""
    x = s.bind(x)
    z = s.bind(x - 1.0)
    small = horner(z, _ACOSH_POLY) * L.call("sqrt", z)
    log_form = L.select(
        L.compare("gt", x, _LOG_ONLY), L.call("log", x) + _LN2, L.call("log", x + L.call("sqrt", z * (x + 1.0)))
    )
    value = L.select(L.compare("lt", z, 0.5), small, log_form)
    return L.select(L.compare("lt", x, 1.0), math.nan, value)


# Cephes atanhf for |x| < 1/2: x + x z P(z), z = x^2; beyond, log((1 + x) / (1 - x)) / 2, which gives +-inf at
# +-1 and NaN beyond, as IEEE division and log do.
_ATANH_POLY = (1.81740078349e-1, 8.24370301058e-2, 1.46691431730e-1, 1.99782164500e-1, 3.33337300303e-1)


def atanh(s: Scope, x: L.Expr) -> L.Expr:
    x = s.bind(x)
    z = s.bind(x * x)
    small = x + x * z * horner(z, _ATANH_POLY)
    large = 0.5 * L.call("log", (1.0 + x) / (1.0 - x))
    return L.select(L.compare("lt", absolute(s, x), 0.5), small, large)
