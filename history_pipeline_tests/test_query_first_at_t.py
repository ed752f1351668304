"""The first sql() query at a T (a worker asks one query at the T of each event): what a query's
exact NUMERIC rewrite needs is made once per catalog state and query while the column types it sees
stay the same, and remade when they change; answers equal those of a rewrite made at that very T."""

from __future__ import annotations

from decimal import Decimal

from history_pipeline import HistoryStore
from history_pipeline.query import engine
from history_pipeline_tests.test_compaction import write

QUERY = "SELECT avg(p) AS avg_p, sum(p) / count(*) AS per_row, avg(u) AS avg_u FROM prices"


def _store(tmp_path, unconstrained):
    """Table ``prices`` (p NUMERIC(12,2), u NUMERIC) with one row inserted at each of t = 2..5;
    ``unconstrained``: u's values at t = 2..5, whose scales fix u's SQL type at each T."""
    store = HistoryStore.open(tmp_path, database="db")
    events = [{"op": "create_table", "t": 1, "table_uuid": "P", "table_name": "prices",
               "columns": [{"column_uuid": "p", "column_name": "p", "data_type": "NUMERIC(12,2)"},
                           {"column_uuid": "u", "column_name": "u", "data_type": "NUMERIC"}]}]
    for t, u in zip(range(2, 6), unconstrained, strict=True):
        events.append({"op": "insert", "t": t, "table_uuid": "P", "key": t,
                       "values": {"p": f"{t}.{t}{t}", "u": u}})
    write(store, events)
    store.compact(spark=False)
    return store


def _rewrites_counted(monkeypatch):
    made = []
    real = engine._rewrite

    def counted(con, query):
        made.append(query)
        return real(con, query)

    monkeypatch.setattr(engine, "_rewrite", counted)
    return made


def _answers_with_rewrite_made_at_each_t(store, times):
    answers = {}
    for t in times:
        engine._REWRITES.clear()  # made afresh at this T
        answers[t] = store.sql(QUERY, t).to_pylist()
    engine._REWRITES.clear()
    return answers


def test_the_exact_rewrite_is_made_once_per_state_while_the_types_stay(tmp_path, monkeypatch):
    store = _store(tmp_path, ["1.5", "2.5", "3.5", "4.5"])  # u is DECIMAL(2, 1) at every T
    expected = _answers_with_rewrite_made_at_each_t(store, range(3, 7))
    made = _rewrites_counted(monkeypatch)
    # each T asked once, each on a cursor of its own: the macros the rewrite calls are made on each
    answers = {t: store.sql(QUERY, t).to_pylist() for t in range(3, 7)}
    assert answers == expected
    assert answers[6] == [{"avg_p": Decimal("3.8850000000000000"), "per_row": Decimal("3.8850000000000000"),
                           "avg_u": Decimal("3.0000000000000000")}]
    assert made == [QUERY]


def test_the_exact_rewrite_is_remade_when_a_column_type_changes_with_t(tmp_path, monkeypatch):
    # u fits DECIMAL(2, 1) as of 3 and 4, DECIMAL(4, 3) from 5 on, DECIMAL(7, 6) from 6 on
    store = _store(tmp_path, ["1.5", "2.5", "0.125", "0.000001"])
    expected = _answers_with_rewrite_made_at_each_t(store, range(3, 7))
    made = _rewrites_counted(monkeypatch)
    answers = {t: store.sql(QUERY, t).to_pylist() for t in range(3, 7)}
    assert answers == expected
    assert answers[6][0]["avg_u"] == Decimal("1.0312502500000000")
    assert made == [QUERY, QUERY, QUERY]
