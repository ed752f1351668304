"""PostgreSQL's ``numeric`` versions of sqrt, exp, ln, log and power, digit for digit.

PostgreSQL answers these on a ``numeric`` argument with a ``numeric`` whose scale (digits after the
point) it chooses from the argument: at least ``NUMERIC_MIN_SIG_DIGITS`` (16) significant digits,
at least the argument's scale, at most 1000, estimated from the argument's leading base-10000
digits (its ``numeric.c``: ``numeric_sqrt``, ``numeric_exp``, ``estimate_ln_dweight``,
``log_var``, ``power_var``, ``power_var_int``). Each function here makes the same choice of scale
and rounds the exact value there, half away from zero; the value itself is computed with Python's
``decimal`` at enough digits beyond that scale that the rounding is exact.

Arguments are ``(value, scale)`` pairs: the value as a ``Decimal`` or ``int``, the scale its
PostgreSQL ``numeric`` has (the column's scale; 0 for an integer).
"""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from fractions import Fraction

MIN_SIG_DIGITS = 16
MAX_DISPLAY_SCALE = 1000
MAX_RESULT_SCALE = 2000
#: digits computed beyond the result's last one, so that rounding there is exact
_GUARD = 12
#: log10(e) as PostgreSQL writes it (its estimates use this double)
_LOG10_E = 0.434294481903252
_LN_10 = 2.302585092994046
#: a context that never rounds (for moving the point)
_EXACT = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


class NumericFunctionError(ArithmeticError):
    """A value PostgreSQL refuses for a numeric function (its own message)."""


def _clamp(rscale: int, *scales: int) -> int:
    return min(MAX_DISPLAY_SCALE, max(rscale, *scales, 0))


def _groups(value: Decimal | int, scale: int) -> tuple[int, list[int]]:
    """PostgreSQL's weight and base-10000 digits of |value| at ``scale`` (no leading or trailing
    zero digits; a zero has weight 0 and no digits)."""
    unscaled = abs(_unscaled(value, scale))
    if unscaled == 0:
        return 0, []
    pad = (-scale) % 4  # the fraction is stored in whole groups of four digits
    text = str(unscaled * 10**pad)
    text = "0" * ((-len(text)) % 4) + text
    digits = [int(text[i:i + 4]) for i in range(0, len(text), 4)]
    weight = len(digits) - 1 - (scale + pad) // 4
    while digits and digits[0] == 0:
        digits.pop(0)
        weight -= 1
    while digits and digits[-1] == 0:
        digits.pop()
    return weight, digits


def _unscaled(value: Decimal | int, scale: int) -> int:
    if isinstance(value, int):
        return value * 10**scale
    return int(value.scaleb(scale).to_integral_value(rounding=decimal.ROUND_DOWN))


def _rounded(value: Fraction | Decimal, rscale: int) -> str:
    """``value`` rounded half away from zero to ``rscale`` places, as PostgreSQL prints it."""
    exact = Fraction(value) * 10**rscale
    magnitude = math.floor(abs(exact) + Fraction(1, 2))
    # through Decimal: Python refuses to print an int of more than 4300 digits
    text = format(Decimal(magnitude).scaleb(-rscale, context=_EXACT), "f")
    return ("-" if exact < 0 and magnitude else "") + text


def _context(rscale: int, weight_digits: int) -> decimal.Context:
    """A context that carries every digit from the result's first to ``_GUARD`` past ``rscale``."""
    return decimal.Context(prec=max(1, weight_digits + 1) + rscale + _GUARD, Emax=decimal.MAX_EMAX,
                           Emin=decimal.MIN_EMIN, rounding=decimal.ROUND_HALF_EVEN)


def _ln_dweight(value: Decimal | int, scale: int) -> int:
    """PostgreSQL's estimate of the decimal weight of ln(value) (estimate_ln_dweight)."""
    v = Decimal(value)
    if v <= 0:
        return 0
    if Decimal("0.9") <= v <= Decimal("1.1"):
        x = v - 1
        if x == 0:
            return 0
        weight, digits = _groups(x, max(scale, 1))
        return weight * 4 + int(math.log10(digits[0]))
    weight, digits = _groups(value, scale)
    leading, dweight = digits[0], weight * 4
    if len(digits) > 1:
        leading, dweight = leading * 10000 + digits[1], dweight - 4
    ln_var = math.log(leading) + dweight * _LN_10
    return int(math.log10(abs(ln_var)))


def _check_positive(value: Decimal | int) -> None:
    if value == 0:
        raise NumericFunctionError("cannot take logarithm of zero")
    if value < 0:
        raise NumericFunctionError("cannot take logarithm of a negative number")


def numeric_sqrt(value: Decimal | int, scale: int) -> str:
    """PostgreSQL's ``sqrt(numeric)``."""
    if value < 0:
        raise NumericFunctionError("cannot take square root of a negative number")
    weight, _ = _groups(value, scale)
    rscale = _clamp(MIN_SIG_DIGITS - ((weight + 1) * 4 // 2 - 1), scale)
    # the integer square root of the value scaled to 2 * (rscale + 1) places is exact truncation
    unscaled = _unscaled(value, scale) * 10 ** (2 * (rscale + 1) - scale)
    root = math.isqrt(unscaled)
    exact = Fraction(root, 10 ** (rscale + 1))
    if root * root != unscaled:  # not exact: what lies below the next digit decides no tie
        exact += Fraction(1, 10 ** (rscale + 2))
    return _rounded(exact, rscale)


def numeric_exp(value: Decimal | int, scale: int) -> str:
    """PostgreSQL's ``exp(numeric)``."""
    estimate = min(max(float(value) * _LOG10_E, -MAX_RESULT_SCALE), MAX_RESULT_SCALE)
    rscale = _clamp(MIN_SIG_DIGITS - int(estimate), scale)
    return _exp(Decimal(value), rscale)


def _exp(value: Decimal, rscale: int) -> str:
    """e ** value rounded at ``rscale``, within PostgreSQL's range (exp_var)."""
    if abs(float(value)) >= MAX_RESULT_SCALE * 3:
        if value > 0:
            raise NumericFunctionError("value overflows numeric format")
        return _rounded(Fraction(0), rscale)
    return _rounded(_context(rscale, max(0, int(float(value) * _LOG10_E) + 1)).exp(value), rscale)


def numeric_ln(value: Decimal | int, scale: int) -> str:
    """PostgreSQL's ``ln(numeric)``."""
    _check_positive(value)
    rscale = _clamp(MIN_SIG_DIGITS - _ln_dweight(value, scale), scale)
    return _rounded(_context(rscale, 5).ln(Decimal(value)), rscale)


def numeric_log(base: Decimal | int, base_scale: int, value: Decimal | int, scale: int) -> str:
    """PostgreSQL's ``log(base numeric, value numeric)`` (``log(x)`` and ``log10(x)`` are ``log(10, x)``)."""
    _check_positive(base)
    _check_positive(value)
    if base == 1:
        raise NumericFunctionError("division by zero")
    rscale = _clamp(MIN_SIG_DIGITS - (_ln_dweight(value, scale) - _ln_dweight(base, base_scale)), base_scale, scale)
    # the quotient's leading digit lies within a few places of 10^dweight; carry generously
    context = _context(rscale + 10, 2 * (abs(_ln_dweight(value, scale)) + abs(_ln_dweight(base, base_scale))) + 10)
    return _rounded(context.divide(context.ln(Decimal(value)), context.ln(Decimal(base))), rscale)


def _is_integral(value: Decimal | int) -> bool:
    return isinstance(value, int) or value == value.to_integral_value()


def numeric_power(base: Decimal | int, base_scale: int, exponent: Decimal | int, exponent_scale: int) -> str:
    """PostgreSQL's ``power(numeric, numeric)`` (and ``numeric ^ numeric``)."""
    if base == 0 and exponent < 0:
        raise NumericFunctionError("zero raised to a negative power is undefined")
    if base < 0 and not _is_integral(exponent):
        raise NumericFunctionError("a negative number raised to a non-integer power yields a complex result")
    if _is_integral(exponent) and -(2**31) <= int(exponent) < 2**31:
        return _power_int(base, base_scale, int(exponent))
    if base == 0:
        return _rounded(Fraction(0), MIN_SIG_DIGITS)
    # PostgreSQL estimates the result's weight from ln(base) to about 8 significant digits
    local = max(8 - _ln_dweight(abs(base), base_scale), 0)
    quantum = Decimal(1).scaleb(-local)
    context = _context(local, 8)
    ln_base = context.ln(abs(Decimal(base))).quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=context)
    ln_num = (ln_base * Decimal(exponent)).quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=context)
    estimate = float(ln_num)
    if abs(estimate) > MAX_RESULT_SCALE * 3.01:
        if estimate > 0:
            raise NumericFunctionError("value overflows numeric format")
        return _rounded(Fraction(0), MAX_DISPLAY_SCALE)
    estimate *= _LOG10_E
    rscale = _clamp(MIN_SIG_DIGITS - int(estimate), base_scale, exponent_scale)
    context = _context(rscale + 10, max(0, int(estimate) + 1))
    # e ** (exponent * ln(base)); a negative base came with an integral exponent (handled above)
    return _exp(context.multiply(context.ln(Decimal(base)), Decimal(exponent)), rscale)


def _power_int(base: Decimal | int, base_scale: int, exponent: int) -> str:
    """PostgreSQL's power_var_int: an integer exponent, at scale max(16, the base's scale) (the
    exponent's own scale plays no part), the exact power rounded."""
    rscale = _clamp(MIN_SIG_DIGITS, base_scale)
    if exponent == 0:
        return _rounded(Fraction(1), rscale)
    if base == 0:
        if exponent < 0:
            raise NumericFunctionError("division by zero")
        return _rounded(Fraction(0), rscale)
    weight, digits = _groups(base, base_scale)
    f, p = float(digits[0]), weight * 4
    for digit in digits[1:4]:
        f, p = f * 10000 + digit, p - 4
    estimate = exponent * (math.log10(f) + p)  # the result's decimal weight, about
    if estimate > 3 * 32767 * 4:
        raise NumericFunctionError("value overflows numeric format")
    if estimate + 1 < -rscale:
        return _rounded(Fraction(0), rscale)
    if abs(exponent) * len(str(abs(_unscaled(base, base_scale)))) <= 20000:  # small enough to be exact
        return _rounded(Fraction(Decimal(base)) ** exponent, rscale)
    context = _context(rscale + 10, max(0, int(estimate) + 2))
    return _rounded(context.power(Decimal(base), exponent), rscale)
