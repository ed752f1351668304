"""The console script's commands as a user runs them: exit codes, output formats, one-line errors.

Most run through its entry point in this process (``cli_support.run_command``); the installed
script itself runs where only a process shows it: its own Spark, its exit, its environment."""

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from history_pipeline import HistoryStore
from history_pipeline_tests.cli_support import SCRIPT, run_command


def run(root, *args, stdin=None):
    return run_command(["--root", str(root), "--database", "db", *args], stdin)


def run_script(root, *args, stdin=None):
    return subprocess.run(
        [SCRIPT, "--root", str(root), "--database", "db", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


T = "7d6c0c1e-0000-4000-8000-00000000000a"  # identifiers are UUIDs
A = "c0000001-0000-4000-8000-00000000000a"
EVENTS = [
    {"op": "create_table", "t": 1, "table_uuid": T, "table_name": "orders",
     "columns": [{"column_uuid": A, "column_name": "amount", "data_type": "NUMERIC(10,2)"}]},
    {"op": "insert", "t": 2, "table_uuid": T, "key": 1, "values": {A: "12.50"}},
    {"op": "update", "t": 3, "table_uuid": T, "key": 1, "values": {A: "13.00"}},
    {"op": "close", "t": 3},
]


@pytest.mark.spark
def test_append_compact_query_history_diff(tmp_path):
    lines = "\n".join(json.dumps(e) for e in EVENTS) + "\n"
    appended = run(tmp_path, "append", "--seal", stdin=lines)  # no JVM: this process's entry point will do
    assert appended.returncode == 0, appended.stderr
    assert "appended 4 events" in appended.stdout
    # the installed script: a Spark session of its own (local[*]), whose JVM output only a process shows
    compacted = run_script(tmp_path, "compact", "--format", "json")
    assert compacted.returncode == 0 and json.loads(compacted.stdout)["frontier"] == 3
    assert "WARN" not in compacted.stderr and "Stage" not in compacted.stderr  # the JVM's output is set aside
    out = run(tmp_path, "sql", "SELECT amount FROM orders", "--as-of", "3", "--format", "json")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"amount": "12.50"}]
    csv = run(tmp_path, "load", "orders", "--as-of", "4", "--format", "csv")
    assert csv.stdout.splitlines() == ['"synthetic_key","amount"', '"1","13.00"']
    history = run(tmp_path, "row-history", "orders", "1")
    assert [json.loads(line)["logical_timestamp"] for line in history.stdout.splitlines()] == [2, 3]
    diff = json.loads(run(tmp_path, "diff", "orders", "--from", "3", "--to", "4", "--format", "json").stdout)
    assert diff["changed"] == [{"key": 1, "before": {"amount": "12.50"}, "after": {"amount": "13.00"}}]
    assert diff["summary"] == {"inserted": 0, "deleted": 0, "changed": 1}
    text = run(tmp_path, "diff", "orders", "--from", "2", "--to", "4").stdout.splitlines()
    assert text[-1] == "1 inserted, 0 deleted, 0 changed in orders between as_of 2 and 4"
    assert text[0] == '+ key 1: {"amount": "13.00"}'


@pytest.mark.slow
def test_errors_are_one_line_with_exit_code_1(tmp_path):
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    run(tmp_path, "compact", "--in-process")
    result = run_script(tmp_path, "load", "orders", "--as-of", "99")
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: as_of=99 is in the future")
    assert len(result.stderr.strip().splitlines()) == 1
    bad = run(tmp_path, "append", stdin='{"op": "insert", "t": 1}\n')
    assert bad.returncode == 1 and "missing field" in bad.stderr
    assert run(tmp_path, "no-such-command").returncode == 2
    assert run_script(tmp_path, "no-such-command").returncode == 2


def test_maintenance_commands(tmp_path, spark):  # retain runs on the test run's session
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    run(tmp_path, "compact", "--in-process")
    assert run(tmp_path, "verify").returncode == 0
    nothing_due = json.loads(run(tmp_path, "snapshots", "--in-process", "--format", "json").stdout)
    assert nothing_due["tables"] == [] and nothing_due["marked_files"] == 0
    forced = json.loads(run(tmp_path, "snapshots", "--force", "--in-process", "--format", "json").stdout)
    assert forced["tables"] == [T] and forced["rows"] == 1 and forced["as_of"] == 4
    assert run(tmp_path, "load", "orders", "--as-of", "4", "--format", "json").stdout.strip() == (
        '{"synthetic_key": 1, "amount": "13.00"}'
    )
    exported = run(tmp_path, "export", "--as-of", "4", "--to", str(tmp_path / "backup"))
    assert exported.returncode == 0 and json.loads(exported.stdout)["tables"] == ["orders"]
    retained = run(tmp_path, "retain", "3", "--cold-tier", str(tmp_path / "cold"), "--format", "json")
    assert retained.returncode == 0 and json.loads(retained.stdout)["files_removed"] == 1
    assert run(tmp_path, "load", "orders", "--as-of", "2").returncode == 1
    assert "earliest answerable as_of is now 0" in run(tmp_path, "load-cold-tier", str(tmp_path / "cold")).stdout
    assert run(tmp_path, "load", "orders", "--as-of", "3", "--format", "json").stdout.strip() == (
        '{"synthetic_key": 1, "amount": "12.50"}'
    )
    assert "rebuilt" in run(tmp_path, "rebuild-catalog").stdout
    assert json.loads(run(tmp_path, "cleanup", "--format", "json").stdout)["tombstones_deleted"] == 0


def test_quarantine_then_release_after_a_fix(tmp_path):
    bad = EVENTS[:2] + [{"op": "update", "t": 3, "table_uuid": T, "key": 99, "values": {A: "1.00"}},
                        {"op": "close", "t": 3}]
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in bad) + "\n")
    failed = run(tmp_path, "compact", "--in-process")
    assert failed.returncode == 1 and "update of key 99, which does not exist" in failed.stderr
    assert "repair" in failed.stderr and "skip" in failed.stderr  # the message says what to do
    listed = run(tmp_path, "segments").stdout
    assert "quarantined" in listed and "key 99" in listed
    verified = run(tmp_path, "verify")
    assert verified.returncode == 1 and "quarantined segment" in verified.stdout
    # the operator edits a copy of the quarantined segment (its old seal no longer matches) and repairs
    segment = next(Path(tmp_path).rglob("quarantine/*.sealed"))
    original = segment.read_bytes()
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text(segment.read_text().replace('"key":99', '"key":1'))
    repaired = run(tmp_path, "repair", "1", "--events", str(fixed), "--reason", "key typo")
    assert repaired.returncode == 0, repaired.stderr
    audit = next(Path(tmp_path).rglob("audit/*/repair.json"))
    record = json.loads(audit.read_text())
    assert record["action"] == "repaired" and record["reason"] == "key typo"
    assert (audit.parent / "original.sealed").read_bytes() == original
    assert "update of key 99" in record["quarantine_error"]
    assert run(tmp_path, "verify").returncode == 0  # the re-sealed segment verifies
    assert json.loads(run(tmp_path, "compact", "--in-process", "--format", "json").stdout)["frontier"] == 3
    assert json.loads(run(tmp_path, "sql", "SELECT amount FROM orders", "--format", "json").stdout) == {
        "amount": "1.00"}


def test_repair_refuses_bad_corrections_and_skip_keeps_an_audit_record(tmp_path):
    bad = EVENTS[:2] + [{"op": "delete", "t": 3, "table_uuid": T, "key": 99}, {"op": "close", "t": 3}]
    later = [{"op": "insert", "t": 4, "table_uuid": T, "key": 2, "values": {A: "2.00"}}, {"op": "close", "t": 4}]
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS[:1] + [{"op": "close", "t": 1}]))
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in bad[1:]) + "\n")
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in later) + "\n")
    assert run(tmp_path, "compact", "--in-process").returncode == 1
    status = run(tmp_path, "status", "--format", "json")
    state = json.loads(status.stdout)
    assert state["frontier"] == 1 and state["pending_segments"] == [3]
    assert state["quarantined_segments"][0]["segment"] == 2 and "key 99" in state["quarantined_segments"][0]["error"]
    # only segment 3 asked for: refused while segment 2 waits
    refused = run(tmp_path, "compact", "--in-process", "--segment", "3")
    assert refused.returncode == 1 and "quarantined" in refused.stderr
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"op": "insert", "t": 2, "table_uuid": T, "key": 1, "values": {}})
                     + '\n{"op": "close", "t": 0}\n')
    out = run(tmp_path, "repair", "2", "--events", str(wrong))
    assert out.returncode == 1 and f"{wrong}, line 2:" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    not_quarantined = run(tmp_path, "repair", "3", "--events", str(wrong))
    assert not_quarantined.stderr.startswith("error: segment 3 of db is not quarantined")
    assert run(tmp_path, "skip", "2").returncode == 2  # --reason is required
    skipped = run(tmp_path, "skip", "2", "--reason", "bad batch from the importer")
    assert skipped.returncode == 0, skipped.stderr
    record = json.loads(next(Path(tmp_path).rglob("audit/*/repair.json")).read_text())
    assert record["action"] == "skipped" and record["lower"] == 1 and record["upper"] == 3
    assert json.loads(run(tmp_path, "compact", "--in-process", "--format", "json").stdout)["frontier"] == 4
    rows = run(tmp_path, "sql", "SELECT synthetic_key, amount FROM orders ORDER BY 1", "--format", "json").stdout
    assert [json.loads(line) for line in rows.splitlines()] == [{"synthetic_key": 2, "amount": "2.00"}]


def test_append_is_all_or_nothing_and_names_file_and_line(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(json.dumps(e) for e in EVENTS[:2]) + "\n"
                      + json.dumps({"op": "insert", "t": 1, "table_uuid": T, "key": 2, "values": {}}) + "\n")
    failed = run(tmp_path, "append", str(events))
    assert failed.returncode == 1
    assert failed.stderr.strip() == (f"error: {events}, line 3: t=1 goes backwards (last event had t=2); "
                                     "nothing was written")
    assert not (tmp_path / "db").exists()  # nothing written, not even a database
    events.write_text("\n".join(json.dumps(e) for e in EVENTS[:2]) + "\n")
    assert run(tmp_path, "append", str(events)).returncode == 0
    typo = tmp_path / "typo.jsonl"
    typo.write_text(json.dumps({"op": "update", "t": 3, "table_uuid": T, "key": 1, "valeus": {}}) + "\n")
    out = run(tmp_path, "append", str(typo))
    assert out.returncode == 1 and "line 1" in out.stderr
    assert "expected fields: op, t, key, table_uuid, values" in out.stderr
    not_uuid = run(tmp_path, "append", stdin=json.dumps({**EVENTS[1], "table_uuid": "T", "t": 5}) + "\n")
    assert not_uuid.returncode == 1 and "<stdin>, line 1: table_uuid 'T' is not a UUID" in not_uuid.stderr
    sealing = run(tmp_path, "append", "--seal", str(events.parent / "typo.jsonl"))
    assert sealing.returncode == 1
    segment = next(Path(tmp_path).rglob("segments/*.open"))
    assert segment.read_text().count("\n") == 3  # the opening close and the two good events, nothing more
    closing = tmp_path / "closing.jsonl"
    closing.write_text(json.dumps(EVENTS[2]) + "\n")
    refused = run(tmp_path, "append", "--seal", str(closing))
    assert refused.returncode == 1 and "not a close" in refused.stderr
    assert segment.read_text().count("\n") == 3


@pytest.mark.slow
def test_user_errors_are_one_line_with_exit_code_1(tmp_path):
    def one_line_error(result, text):
        assert result.returncode == 1, result
        assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert text in result.stderr, result.stderr
        assert "Traceback" not in result.stderr

    missing_root = tmp_path / "nowhere"
    one_line_error(run(missing_root, "status"), "does not exist")
    assert not missing_root.exists()  # a read never creates
    for command in (["segments"], ["verify"], ["tables"], ["sql", "SELECT 1"], ["history"]):
        one_line_error(run(missing_root, *command), "no database 'db'")
    assert not missing_root.exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    one_line_error(run(a_file, "status"), "is a file")
    one_line_error(run(tmp_path, "append", str(tmp_path / "missing.jsonl")), "no such file")
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    other = run_command(["--root", str(tmp_path), "--database", "other", "tables"])
    one_line_error(other, "databases found there: db")
    run(tmp_path, "compact", "--in-process")
    one_line_error(run(tmp_path, "sql", "SELEC * FROM orders"), 'SQL syntax error: syntax error at or near "SELEC"')
    missing_table = run(tmp_path, "sql", "SELECT * FROM pg_clas")
    one_line_error(missing_table, "no table 'pg_clas'")
    assert "pg_class" not in missing_table.stderr and "tables then: orders" in missing_table.stderr
    one_line_error(run(tmp_path, "sql", "SELECT * FROM ordrs"), 'did you mean "orders"')
    unknown_key = run(tmp_path, "row-history", "orders", "99")  # as the API: no versions, not an error
    assert unknown_key.returncode == 0 and unknown_key.stdout == "" and "key 99 of table orders has no version" in (
        unknown_key.stderr)
    assert HistoryStore.open(tmp_path, database="db").row_history("orders", 99) == []
    one_line_error(run(tmp_path, "diff", "orders", "--from", "2000", "--to", "1000"), "must not be after")
    one_line_error(run(tmp_path, "load", "orders", "--as-of", "99"), "as_of=99 is in the future")
    no_credentials = subprocess.run(  # an environment of its own: a process
        [SCRIPT, "--root", "s3://some-bucket/prefix", "status"], capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
            "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true"},
    )
    one_line_error(no_credentials, "no S3 credentials")
    # --debug works after the command too, and shows the stack trace
    debug = run_script(tmp_path, "load", "orders", "--as-of", "99", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_tables_status_history_and_sql_statements(tmp_path, spark):  # retain on the run's session
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    run(tmp_path, "compact", "--in-process")
    tables = run(tmp_path, "tables", "--as-of", "2", "--format", "json")
    assert [json.loads(line) for line in tables.stdout.splitlines()] == [
        {"name": "orders", "table_uuid": T, "columns": 1}]
    assert run(tmp_path, "tables", "--as-of", "1", "--format", "json").stdout == ""  # created at t=1
    described = run(tmp_path, "sql", "DESCRIBE orders", "--format", "json")
    column = json.loads(described.stdout.splitlines()[0])
    assert column["column_name"] == "amount" and column["column_type"] == "NUMERIC(10,2)" and column["null"] == "YES"
    plan = run(tmp_path, "sql", "EXPLAIN SELECT sum(amount) FROM orders", "--format", "json")
    assert plan.returncode == 0 and "physical_plan" in plan.stdout
    assert run(tmp_path, "sql", "EXPLAIN DELETE FROM orders").returncode == 1
    catalog_plan = run(tmp_path, "sql", "EXPLAIN SELECT count(*) FROM _history_catalog.schema_history")
    assert catalog_plan.returncode == 0 and "physical_plan" in catalog_plan.stdout
    status = json.loads(run(tmp_path, "status", "--format", "json").stdout)
    assert status["frontier"] == 3 and status["earliest"] == 0 and status["pending_segments"] == []
    assert status["last_compaction"]["operation"] == "compact segment 00000000000000000001"
    assert run(tmp_path, "frontier").stdout == "3\n"
    text_status = run(tmp_path, "status").stdout
    assert "frontier:" in text_status and "quarantined_segments:  none" in text_status
    run(tmp_path, "retain", "3")
    history = [json.loads(line) for line in run(tmp_path, "history", "--format", "json").stdout.splitlines()]
    assert [h["version"] for h in history] == [1, 0]
    assert history[1]["operation"].startswith("compact") and history[1]["files_added"] == 2
    assert history[1]["frontier"] == 3
    assert history[0]["files_removed"] >= 1


def test_shell_reads_statements_as_of_t(tmp_path):
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    run(tmp_path, "compact", "--in-process")
    script = ("SELECT amount\n  FROM orders;\n.as_of 3\nSELECT amount FROM orders;\nSELEC 1;\n"
              "DELETE FROM orders;\n.as_of 99\nSHOW TABLES;\n.quit\nSELECT 'never';\n")
    shell = run(tmp_path, "shell", "--format", "json", stdin=script)
    assert shell.returncode == 1  # a piped script whose statements failed fails
    assert shell.stdout.splitlines() == ['{"amount": "13.00"}', "as_of = 3", '{"amount": "12.50"}',
                                         json.dumps({"name": "orders", "table_uuid": T, "columns": 1})]
    errors = shell.stderr.strip().splitlines()
    assert len(errors) == 3
    assert errors[0].startswith("error: SQL syntax error") and "only read-only" in errors[1]
    assert "as_of=99 is in the future" in errors[2]


def test_every_command_documents_its_arguments():
    from history_pipeline.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # the registered commands, whoever added them
    for name, command in commands.items():
        # in-process: a subprocess per command costs seconds of imports and tests nothing more
        text = command.format_help()
        for action in command._actions:
            if action.help is None or action.dest == "help":
                continue
            assert action.help.strip(), f"{name}: {action.dest} has no help"
        assert "--debug" in text and "--root" in text, name
    # the installed console script runs and prints the help
    sql_help = subprocess.run([SCRIPT, "sql", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "default: table" in sql_help and "frontier + 1" in sql_help


@pytest.mark.slow
def test_parquet_output_holds_interval_columns(tmp_path):
    """Parquet has no type for Arrow's month_day_nano values: an interval column is written as the
    store keeps it (months, days, micros) instead of failing."""
    spans, span = "7d6c0c1e-0000-4000-8000-00000000000b", "c0000002-0000-4000-8000-00000000000b"
    events = [
        {"op": "create_table", "t": 1, "table_uuid": spans, "table_name": "spans",
         "columns": [{"column_uuid": span, "column_name": "span", "data_type": "INTERVAL"}]},
        {"op": "insert", "t": 2, "table_uuid": spans, "key": 1,
         "values": {span: {"months": 1, "days": 2, "micros": 3}}},
        {"op": "insert", "t": 2, "table_uuid": spans, "key": 2, "values": {span: None}},
        {"op": "close", "t": 2},
    ]
    assert run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in events) + "\n").returncode == 0
    assert run(tmp_path, "compact", "--in-process").returncode == 0
    for command in (["sql", "SELECT * FROM spans ORDER BY synthetic_key"], ["load", "spans"]):
        out = subprocess.run([SCRIPT, "--root", str(tmp_path), "--database", "db", *command, "--format", "parquet"],
                             capture_output=True, timeout=180)
        assert out.returncode == 0, out.stderr
        table = pq.read_table(pa.BufferReader(out.stdout)).sort_by("synthetic_key")
        assert table.column("span").to_pylist() == [{"months": 1, "days": 2, "micros": 3}, None], command


def test_usage_errors_are_one_line_naming_the_nearest_word(tmp_path):
    typo = run(tmp_path, "comapct")
    assert typo.returncode == 2 and typo.stderr.count("\n") == 1
    assert "unknown command 'comapct'; did you mean 'compact'?" in typo.stderr
    option = run(tmp_path, "sql", "SELECT 1", "--as-off", "3")
    assert option.returncode == 2 and option.stderr.count("\n") == 1 and "did you mean '--as-of'?" in option.stderr
    value = run(tmp_path, "sql", "SELECT 1", "--format", "jsn")
    assert value.returncode == 2 and value.stderr.count("\n") == 1 and "did you mean 'json'?" in value.stderr
    missing = run(tmp_path, "erase", "orders", "1")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "--by" in missing.stderr


def test_commands_print_for_a_person_and_json_on_request(tmp_path):
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    compacted = run(tmp_path, "compact", "--in-process")
    assert compacted.returncode == 0, compacted.stderr
    lines = compacted.stdout.splitlines()
    assert lines[0] == "compacted 1 segment" and "tables touched" in compacted.stdout and "orders" in compacted.stdout
    assert not compacted.stdout.lstrip().startswith("{")
    nothing = run(tmp_path, "compact", "--in-process")
    assert nothing.returncode == 0 and nothing.stdout.startswith("nothing to compact")
    assert "frontier 3" in nothing.stdout
    assert json.loads(run(tmp_path, "compact", "--in-process", "--format", "json").stdout)["segments_applied"] == []

    plan = run(tmp_path, "sql", "EXPLAIN SELECT sum(amount) FROM orders")
    assert plan.returncode == 0 and "\\n" not in plan.stdout and len(plan.stdout.splitlines()) > 5

    described = run(tmp_path, "sql", "DESCRIBE orders", "--format", "json")
    assert json.loads(described.stdout) == {"column_name": "amount", "column_type": "NUMERIC(10,2)", "null": "YES",
                                            "default": None}
    extended = json.loads(run(tmp_path, "sql", "DESCRIBE EXTENDED orders", "--format", "json").stdout)
    assert extended["column_uuid"] == A and extended["supercolumn"].startswith(A)

    csv = run(tmp_path, "sql", "SELECT [1, 2] AS a, {'x': 'y'} AS s, NULL::INT[] AS n", "--format", "csv")
    assert csv.stdout.splitlines() == ['"a","s","n"', '"[1, 2]","{""x"": ""y""}",']

    piped = run(tmp_path, "shell", stdin="SELECT 1 AS one;\nSELECT nope;\nSELECT 2 AS two;\n")
    assert piped.returncode == 1 and "two" in piped.stdout and piped.stderr.count("error:") == 1
    assert run(tmp_path, "shell", stdin="SELECT 1 AS one;\n").returncode == 0


def test_a_captured_database_shows_its_timestamps_as_lsns(tmp_path):
    base = (0x16 << 32) | 0xB374D800  # LSN 16/B374D800: a captured database's t are commit LSNs
    events = [dict(e, t=base + e["t"]) for e in EVENTS]
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in events) + "\n")
    run(tmp_path, "compact", "--in-process")
    plain = run(tmp_path, "status").stdout
    assert f"frontier:              {base + 3}" in plain  # not captured: integers
    store = HistoryStore.open(tmp_path, database="db")
    (store.wal_dir / "capture").mkdir()
    (store.wal_dir / "capture" / "history_capture.json").write_text("{}")

    status = run(tmp_path, "status").stdout
    assert "frontier:              16/B374D803" in status and "[0/0, 16/B374D804]" in status
    assert json.loads(run(tmp_path, "status", "--format", "json").stdout)["frontier_lsn"] == "16/B374D803"
    history = run(tmp_path, "history", "--format", "json").stdout.splitlines()
    assert json.loads(history[0])["frontier"] == "16/B374D803"
    diff = run(tmp_path, "diff", "orders", "--from", "16/B374D803", "--to", "16/B374D804").stdout
    assert diff.splitlines()[-1].endswith("between as_of 16/B374D803 and 16/B374D804")
    beyond = run(tmp_path, "sql", "SELECT 1", "--as-of", "16/B374D900")
    assert beyond.returncode == 1 and "(16/B374D900)" in beyond.stderr and "(16/B374D803)" in beyond.stderr


@pytest.mark.spark
def test_demo_prints_aligned_lines_and_no_warning(tmp_path, spark):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_command(["--root", str(tmp_path), "demo"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    ours = [w for w in caught if "history_pipeline" in w.filename]
    assert not ours, [str(w.message) for w in ours]
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": 13 segments")  # the WAL in one line, not a line per segment
    assert lines[1] == "compacted 13 segments"
    assert "  versions written  4,501" in lines
    assert "  tables touched    clients, orders, audit_tmp (dropped)" in lines  # names, not identifiers
    assert not any(line.lstrip().startswith(("{", "compaction:")) for line in lines)  # no JSON
    tables = lines.index("tables now")
    assert lines[tables + 1:tables + 3] == [
        "  clients  name, email",
        "  orders   priority, customer_id, amount, state, tags",
    ]
    history = lines[lines.index("history of order 10000 (t: the version's logical timestamp)") + 1:]
    assert history[0] == "  t 503   customer_id 78, amount 518.50, status new, tags gift, bulk"
    assert history[-1] == "  t 510   deleted"
