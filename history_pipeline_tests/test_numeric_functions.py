"""PostgreSQL's numeric sqrt, exp, ln, log and power, digit for digit: answers PostgreSQL 15 gave
for the same calls (its result scale depends on each value), and the values it refuses."""

from __future__ import annotations

from decimal import Decimal

import pytest

from history_pipeline.query.numeric_functions import (
    NumericFunctionError,
    numeric_exp,
    numeric_ln,
    numeric_log,
    numeric_power,
    numeric_sqrt,
)


def _n(text: str) -> tuple[Decimal, int]:
    """A numeric literal as (value, its scale)."""
    return Decimal(text), len(text.partition(".")[2])


#: (call, PostgreSQL 15's answer as text)
ANSWERS = [
    (lambda: numeric_sqrt(*_n("0.00000000000099560965")), "0.00000099780241029975469"),
    (lambda: numeric_sqrt(*_n("0")), "0.000000000000000"),
    (lambda: numeric_sqrt(*_n("10000.00")), "100.0000000000000"),
    (lambda: numeric_exp(*_n("-2.250")), "0.1053992245618643"),
    (lambda: numeric_exp(*_n("40.000")), "235385266837019985.408"),
    (lambda: numeric_ln(*_n("1.0000000001")), "0.00000000009999999999500000"),
    (lambda: numeric_ln(*_n("0.95")), "-0.051293294387550533"),
    (lambda: numeric_log(*_n("2.0"), *_n("1.05")), "0.070389327891397941"),
    (lambda: numeric_log(10, 0, *_n("1000.0")), "3.0000000000000000"),
    (lambda: numeric_power(*_n("63.3"), -1, 0), "0.0157977883096367"),
    (lambda: numeric_power(*_n("420975.74"), 7, 0), "2343146718131749843549411600968376858850.2880996939302400"),
    (lambda: numeric_power(*_n("2.5"), *_n("0.5")), "1.5811388300841897"),
    (lambda: numeric_power(*_n("0.00"), 3, 0), "0.0000000000000000"),
    (lambda: numeric_power(*_n("10.0"), *_n("0.5")), "3.1622776601683793"),
    (lambda: numeric_power(*_n("1.0001"), *_n("100000.5")), "22016.556793836682"),
]


@pytest.mark.parametrize("index", range(len(ANSWERS)))
def test_answers_and_scales_are_postgresqls(index):
    call, expected = ANSWERS[index]
    assert call() == expected


def test_results_are_the_exact_value_rounded_half_away_from_zero():
    """An exact square root or power comes back exact; otherwise the last digit is the exact value's,
    rounded half away from zero, at either sign."""
    assert numeric_sqrt(*_n("2.25")) == "1.500000000000000"
    assert numeric_sqrt(*_n("2")) == "1.414213562373095"  # ...0488 exactly: rounded down
    assert numeric_sqrt(*_n("0.0000000000000000000000000000000001")) == "0.0000000000000000100000000000000000"
    assert numeric_power(*_n("-1.5"), 3, 0) == "-3.3750000000000000"
    assert numeric_power(*_n("-0.5"), -1, 0) == "-2.0000000000000000"


@pytest.mark.parametrize(("call", "message"), [
    (lambda: numeric_sqrt(*_n("-0.01")), "square root of a negative number"),
    (lambda: numeric_ln(*_n("0.00")), "logarithm of zero"),
    (lambda: numeric_log(*_n("1.0"), *_n("5")), "division by zero"),
    (lambda: numeric_power(*_n("0.0"), -2, 0), "zero raised to a negative power"),
    (lambda: numeric_power(*_n("-2.0"), *_n("0.5")), "complex result"),
    (lambda: numeric_exp(*_n("6000.5")), "overflows"),
])
def test_values_postgresql_refuses_are_refused_with_its_message(call, message):
    with pytest.raises(NumericFunctionError, match=message):
        call()
