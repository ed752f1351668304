"""Division and AVG of NUMERIC and integers are exact decimals at PostgreSQL's scale, never DuckDB's DOUBLE.

The rewrite is checked on a bare DuckDB connection against exact rational arithmetic and a model of
PostgreSQL's ``select_div_scale``, then through ``HistoryStore.sql``.
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
from history_pipeline.errors import QueryError
from history_pipeline.query.exact_numeric import exact_numeric_rewrite, exact_type, quotient_texts, result_scale
from history_pipeline_tests.test_compaction import write


def _weight_and_digit(value: Decimal) -> tuple[int, int]:
    """PostgreSQL's base-10000 weight and first digit of a value (0, 0 for zero)."""
    if value == 0:
        return 0, 0
    magnitude = abs(Fraction(value))
    weight = 0
    while magnitude >= 10000:
        magnitude /= 10000
        weight += 1
    while magnitude < 1:
        magnitude *= 10000
        weight -= 1
    return weight, math.floor(magnitude)


def pg_quotient(a: Decimal, b: Decimal, scale_a: int, scale_b: int) -> Decimal:
    """PostgreSQL's numeric a / b: select_div_scale, then rounded half away from zero."""
    wa, fa = _weight_and_digit(a)
    wb, fb = _weight_and_digit(b)
    qweight = wa - wb - (1 if fa <= fb else 0)
    scale = min(1000, max(16 - 4 * qweight, scale_a, scale_b, 0))
    exact = Fraction(a) / Fraction(b) * 10 ** scale
    rounded = math.floor(abs(exact) + Fraction(1, 2))
    return Decimal(f"{rounded if exact >= 0 else -rounded}E-{scale}")


def run(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple]:
    """The rewritten query's rows, each quotient column exact from its operands (as the engine gives it)."""
    exact = exact_numeric_rewrite(con, query)
    table = con.sql(exact.query).to_arrow_table()
    columns = [c.to_pylist() for c in table.columns]
    for q in exact.quotients:
        texts = quotient_texts([table.column(i) for i in q.columns], q)
        columns[q.shown] = [None if t is None else Decimal(t) for t in texts]
    width = exact.shown_columns if exact.quotients else len(columns)
    return list(zip(*columns[:width], strict=True)) if columns else []


decimals = st.decimals(min_value=Decimal("-99999999.999"), max_value=Decimal("99999999.999"), places=3,
                       allow_nan=False, allow_infinity=False)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.one_of(st.none(), decimals), min_size=0, max_size=12))
def test_average_of_decimals_is_postgresqls_numeric_average(values):
    con = duckdb.connect()
    con.execute("CREATE TABLE t (x DECIMAL(11, 3))")
    for value in values:
        con.execute("INSERT INTO t VALUES (?)", [value])
    (result,), = run(con, "SELECT avg(x) FROM t")
    present = [v for v in values if v is not None]
    expected = pg_quotient(sum(present, Decimal(0)), Decimal(len(present)), 3, 0) if present else None
    assert str(result) == str(expected)


@settings(max_examples=20, deadline=None)
@given(decimals, decimals.filter(lambda d: d != 0), st.integers(min_value=-10**6, max_value=10**6).filter(bool))
def test_division_is_postgresqls_numeric_division(a, b, n):
    con = duckdb.connect()
    con.execute("SET integer_division = true")  # the engine's setting: / parses as //
    con.execute("CREATE TABLE t (a DECIMAL(11, 3), b DECIMAL(11, 3), n INTEGER)")
    con.execute("INSERT INTO t VALUES (?, ?, ?)", [a, b, n])
    row = run(con, "SELECT a / b, a / n, n / b FROM t")[0]
    expected = (pg_quotient(a, b, 3, 3), pg_quotient(a, Decimal(n), 3, 0), pg_quotient(Decimal(n), b, 0, 3))
    assert tuple(map(str, row)) == tuple(map(str, expected))
    # inside an expression the quotient is DECIMAL(38, 20): the same value where 20 places hold it
    (inner,), = con.sql(exact_numeric_rewrite(con, "SELECT (a / b) * 1 FROM t").query).fetchall() \
        if -expected[0].as_tuple().exponent <= 20 else [(expected[0],)]
    assert inner == expected[0]


def test_average_rounds_half_away_from_zero_both_signs():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 1::DECIMAL(3,0)), (1, 2), (2, -1), (2, -2), "
                "(3, -1), (3, -1), (3, -2)) v(g, x)")
    rows = run(con, "SELECT g, avg(x) FROM t GROUP BY g ORDER BY g")
    assert [(g, str(a)) for g, a in rows] == [(1, "1.5000000000000000"), (2, "-1.5000000000000000"),
                                             (3, "-1.3333333333333333")]
    con.execute("CREATE TABLE u AS SELECT * FROM (VALUES (0.00000000000000005::DECIMAL(18,17)), (0)) v(x)")
    # 0.000000000000000025: PostgreSQL's scale is 36 (a weight of -5 in base 10000), no tie to round
    assert run(con, "SELECT avg(x) FROM u")[0][0].as_tuple() == Decimal("0." + "0" * 16 + "25" + "0" * 18).as_tuple()


def test_every_form_of_average_is_rewritten_and_other_types_keep_duckdbs():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (0.1::DECIMAL(5,1), 1, 1.5::DOUBLE, 'a', INTERVAL 1 DAY), "
                "(0.2, 2, 2.5, 'a', INTERVAL 2 DAY), (0.4, 2, 1.0, 'b', INTERVAL 3 DAY)) v(x, i, d, g, iv)")
    third = Decimal("0.23333333333333333333")
    assert run(con, "SELECT avg(x), mean(x), AVG(i) FROM t") == [(third, third, Decimal("1.6666666666666667"))]
    assert run(con, "SELECT avg(DISTINCT i) FILTER (WHERE x > 0.1) FROM t") == [(Decimal("2"),)]
    assert run(con, "SELECT g FROM t GROUP BY g HAVING avg(x) = 0.15") == [("a",)]
    assert run(con, "SELECT x, avg(x) OVER (PARTITION BY g ORDER BY x) FROM t ORDER BY x") == [
        (Decimal("0.1"), Decimal("0.1")), (Decimal("0.2"), Decimal("0.15")), (Decimal("0.4"), Decimal("0.4"))]
    assert run(con, "WITH q AS (SELECT avg(x) AS a FROM t) SELECT a * 3 FROM q") == [(third * 3,)]
    assert run(con, "SELECT avg(x) FROM t WHERE false") == [(None,)]
    # DOUBLE and INTERVAL averages and divisions are DuckDB's own (PostgreSQL's float8 ones are float8 too)
    unchanged = "SELECT avg(d), avg(iv), sum(d) / 2 FROM t"
    assert exact_numeric_rewrite(con, unchanged).query == unchanged
    assert con.sql(unchanged).types == ["DOUBLE", "INTERVAL", "DOUBLE"]
    # a query without an average or a division is not even parsed
    assert exact_numeric_rewrite(con, "SELECT 1").query == "SELECT 1"


def test_an_average_beside_its_sum_reads_the_shown_sum():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES ('a', 1.25::DECIMAL(9,2)), ('a', NULL), ('a', 2.50), "
                "('b', 0.01)) v(g, q)")
    query = "SELECT g, sum(q) AS s, avg(q) AS a, count(*) AS n FROM t GROUP BY g ORDER BY g"
    exact = exact_numeric_rewrite(con, query)
    # the sum the query shows is read as the average's dividend; only count(q) rides along hidden
    assert [q.columns for q in exact.quotients] == [(1, 4)]
    assert exact.shown_columns == 4
    assert con.sql(exact.query).columns[4:] == [c for c in con.sql(exact.query).columns if c.startswith("__hp")]
    assert len(con.sql(exact.query).columns) == 5
    assert run(con, query) == [("a", Decimal("3.75"), Decimal("1.8750000000000000"), 3),
                               ("b", Decimal("0.01"), Decimal("0.01000000000000000000"), 1)]


def test_result_scales_keep_room_for_digits():
    integer, count = exact_type("INTEGER"), exact_type("BIGINT")
    assert result_scale(exact_type("DECIMAL(15,2)"), exact_type("DECIMAL(15,2)")) == 20
    assert result_scale(exact_type("DECIMAL(38,30)"), integer) == 30
    assert result_scale(exact_type("DECIMAL(30,3)"), count, average=True) == 11  # the mean never exceeds x
    assert result_scale(integer, count, average=True) == 20
    assert exact_type("DOUBLE") is None and exact_type("INTERVAL") is None


NUMERIC_TABLE = [{"op": "create_table", "t": 1, "table_uuid": "M", "table_name": "money",
                  "columns": [{"column_uuid": "v", "column_name": "v", "data_type": "NUMERIC"},
                              {"column_uuid": "n", "column_name": "n", "data_type": "INTEGER"}]}]


def test_store_sql_divides_and_averages_plain_numeric_exactly(tmp_path):
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
    # v is DECIMAL(p, 7) here (its widest scale): the sum 0.3000001 / 3
    assert row["avg(v)"].as_tuple() == pg_quotient(Decimal("0.3000001"), Decimal(3), 7, 0).as_tuple()
    assert str(row["mean_key"]) == "1.6666666666666667"  # n = 0, 1, 4 (PostgreSQL: numeric)
    ratio = store.sql("SELECT 100.00 * sum(v) / sum(n) AS p FROM money", as_of=3).to_pylist()
    assert ratio[0]["p"].as_tuple() == pg_quotient(Decimal("1234.000010000"), Decimal(10), 9, 0).as_tuple()
    with pytest.raises(QueryError, match="needs 28 digits after the point"):
        store.sql("SELECT sum(v / 10000000) FROM money", as_of=3)


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
    assert str(average) == "493827160549382716054938271.606"  # PostgreSQL's: the scale of v, 3 places
