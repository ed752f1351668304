"""AVG of NUMERIC and integers is exact (PostgreSQL's numeric average), never DuckDB's DOUBLE.

The rewrite is checked on a bare DuckDB connection against exact rational arithmetic, then
through ``HistoryStore.sql`` on unconstrained NUMERIC, where the reviewers saw floats.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from history_pipeline import HistoryStore
from history_pipeline.query.exact_avg import average_scales, rewrite_exact_averages
from history_pipeline_tests.test_compaction import write


def expected_average(values: list[Decimal | None], scale: int) -> Decimal | None:
    """The exact mean rounded half away from zero to ``scale`` places (PostgreSQL's numeric rounding)."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    scaled = sum((Fraction(v) for v in present), Fraction(0)) / len(present) * 10 ** scale
    rounded = math.floor(abs(scaled) + Fraction(1, 2))
    return Decimal(f"{rounded if scaled >= 0 else -rounded}E-{scale}")  # exact, whatever the context


def run(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple]:
    return con.sql(rewrite_exact_averages(con, query)).fetchall()


decimals = st.decimals(min_value=Decimal("-99999999.999"), max_value=Decimal("99999999.999"), places=3,
                       allow_nan=False, allow_infinity=False)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), decimals), min_size=0, max_size=12))
def test_average_of_decimals_is_the_exact_mean_rounded(values):
    con = duckdb.connect()
    con.execute("CREATE TABLE t (x DECIMAL(11, 3))")
    for value in values:
        con.execute("INSERT INTO t VALUES (?)", [value])
    scale = average_scales("DECIMAL(11,3)")[1]
    assert scale == 16
    (result,), = run(con, "SELECT avg(x) FROM t")
    assert result == expected_average(values, scale)
    assert result is None or isinstance(result, Decimal)


def test_average_rounds_half_away_from_zero_both_signs():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 1::DECIMAL(3,0)), (1, 2), (2, -1), (2, -2), "
                "(3, -1), (3, -1), (3, -2)) v(g, x)")
    rows = run(con, "SELECT g, avg(x) FROM t GROUP BY g ORDER BY g")
    assert rows == [(1, Decimal("1.5")), (2, Decimal("-1.5")), (3, Decimal("-1.3333333333333333"))]
    con.execute("CREATE TABLE u AS SELECT * FROM (VALUES (0.00000000000000005::DECIMAL(18,17)), (0)) v(x)")
    # 0.000000000000000025 at 17 places: the tie rounds away from zero
    assert run(con, "SELECT avg(x) FROM u") == [(Decimal("0.00000000000000003"),)]
    con.execute("CREATE TABLE w AS SELECT -x AS x FROM u")
    assert run(con, "SELECT avg(x) FROM w") == [(Decimal("-0.00000000000000003"),)]


def test_every_form_of_average_is_rewritten_and_other_types_keep_duckdbs():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (0.1::DECIMAL(5,1), 1, 1.5::DOUBLE, 'a', INTERVAL 1 DAY), "
                "(0.2, 2, 2.5, 'a', INTERVAL 2 DAY), (0.4, 2, 1.0, 'b', INTERVAL 3 DAY)) v(x, i, d, g, iv)")
    third = Decimal("0.2333333333333333")
    assert run(con, "SELECT avg(x), mean(x), AVG(i) FROM t") == [(third, third, Decimal("1.6666666666666667"))]
    assert run(con, "SELECT avg(DISTINCT i) FILTER (WHERE x > 0.1) FROM t") == [(Decimal("2"),)]
    assert run(con, "SELECT g FROM t GROUP BY g HAVING avg(x) = 0.15") == [("a",)]
    assert run(con, "SELECT x, avg(x) OVER (PARTITION BY g ORDER BY x) FROM t ORDER BY x") == [
        (Decimal("0.1"), Decimal("0.1")), (Decimal("0.2"), Decimal("0.15")), (Decimal("0.4"), Decimal("0.4"))]
    assert run(con, "SELECT (SELECT avg(x) FROM t t2 WHERE t2.g = t.g) FROM t ORDER BY x") == [
        (Decimal("0.15"),), (Decimal("0.15"),), (Decimal("0.4"),)]
    assert run(con, "WITH q AS (SELECT avg(x) AS a FROM t) SELECT a * 3 FROM q") == [(third * 3,)]
    assert run(con, "SELECT avg(x) FROM t WHERE false") == [(None,)]
    # DOUBLE and INTERVAL averages are DuckDB's own (PostgreSQL's avg(float8) is float8 too)
    unchanged = "SELECT avg(d), avg(iv) FROM t"
    assert rewrite_exact_averages(con, unchanged) == unchanged
    assert con.sql("SELECT avg(d), avg(iv) FROM t").types == ["DOUBLE", "INTERVAL"]
    # a query without an average is not even parsed
    assert rewrite_exact_averages(con, "SELECT 1") == "SELECT 1"


def test_integer_widths_keep_room_for_their_digits():
    assert average_scales("INTEGER") == (0, 16)
    assert average_scales("BIGINT") == (0, 16)
    assert average_scales("DECIMAL(38,2)") == (2, 2)  # no room beyond its own scale
    assert average_scales("DECIMAL(30,3)") == (3, 11)
    assert average_scales("DECIMAL(38,20)") == (20, 20)
    assert average_scales("DOUBLE") is None and average_scales("INTERVAL") is None


NUMERIC_TABLE = [{"op": "create_table", "t": 1, "table_uuid": "M", "table_name": "money",
                  "columns": [{"column_uuid": "v", "column_name": "v", "data_type": "NUMERIC"},
                              {"column_uuid": "n", "column_name": "n", "data_type": "INTEGER"}]}]


def test_store_sql_averages_plain_numeric_exactly(tmp_path):
    values = ["0.1", "0.2", "12.3400", "-0.30", "1E-7"]
    events = NUMERIC_TABLE + [
        {"op": "insert", "t": 2, "table_uuid": "M", "key": k, "values": {"v": v, "n": k}}
        for k, v in enumerate(values)
    ]
    store = HistoryStore.open(tmp_path, database="db")
    write(store, events)
    store.compact(spark=False)
    result = store.sql("SELECT avg(v), avg(n) AS mean_key, sum(v) FROM money WHERE v > 0 AND v < 1", as_of=3)
    assert result.column_names == ["avg(v)", "mean_key", "sum(v)"]  # the user's names survive the rewrite
    row = result.to_pylist()[0]
    assert row["avg(v)"] == expected_average([Decimal("0.1"), Decimal("0.2"), Decimal("1E-7")], 16)
    assert row["mean_key"] == Decimal("1.6666666666666667")  # n = 0, 1, 4 (PostgreSQL: numeric)
    pair = store.sql("SELECT avg(v) AS a FROM money WHERE v IN (0.1, 0.2)", as_of=3).column("a").to_pylist()
    assert pair == [Decimal("0.15")]


@pytest.mark.parametrize("query", ["SELECT avg(v) FROM money", "SELECT avg(v) OVER () FROM money LIMIT 1"])
def test_averages_of_values_near_38_digits_stay_exact(tmp_path, query):
    thirty = "987654321098765432109876543.210"
    events = NUMERIC_TABLE + [
        {"op": "insert", "t": 2, "table_uuid": "M", "key": 1, "values": {"v": thirty}},
        {"op": "insert", "t": 2, "table_uuid": "M", "key": 2, "values": {"v": "0.001"}},
    ]
    store = HistoryStore.open(tmp_path, database="db")
    write(store, events)
    store.compact(spark=False)
    (average,) = store.sql(query, as_of=3).column(0).to_pylist()
    exact = (Fraction(Decimal(thirty)) + Fraction(Decimal("0.001"))) / 2
    assert isinstance(average, Decimal)
    assert abs(Fraction(average) - exact) <= Fraction(1, 10 ** 8)  # DECIMAL(30,3): 8 places of room
