"""The console script, run as a user runs it: exit codes, output formats, one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = str(Path(sys.executable).parent / "history-pipeline")


def run(root, *args, stdin=None):
    return subprocess.run(
        [SCRIPT, "--root", str(root), "--database", "db", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )


EVENTS = [
    {"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "orders",
     "columns": [{"column_uuid": "a", "column_name": "amount", "data_type": "NUMERIC(10,2)"}]},
    {"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"a": "12.50"}},
    {"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"a": "13.00"}},
    {"op": "close", "t": 3},
]


def test_append_compact_query_history_diff(tmp_path):
    lines = "\n".join(json.dumps(e) for e in EVENTS) + "\n"
    appended = run(tmp_path, "append", "--seal", stdin=lines)
    assert appended.returncode == 0, appended.stderr
    assert "appended 4 events" in appended.stdout
    compacted = run(tmp_path, "compact")  # the default: Spark, local[*]
    assert compacted.returncode == 0 and json.loads(compacted.stdout)["frontier"] == 3
    out = run(tmp_path, "sql", "SELECT amount FROM orders", "--as-of", "3", "--format", "json")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"amount": "12.50"}]
    csv = run(tmp_path, "load", "orders", "--as-of", "4", "--format", "csv")
    assert csv.stdout.splitlines() == ['"synthetic_key","amount"', '"1","13.00"']
    history = run(tmp_path, "row-history", "orders", "1")
    assert [json.loads(line)["logical_timestamp"] for line in history.stdout.splitlines()] == [2, 3]
    diff = json.loads(run(tmp_path, "diff", "orders", "--from", "3", "--to", "4").stdout)
    assert diff["changed"] == [{"key": 1, "before": {"amount": "12.50"}, "after": {"amount": "13.00"}}]


def test_errors_are_one_line_with_exit_code_1(tmp_path):
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    run(tmp_path, "compact", "--in-process")
    result = run(tmp_path, "load", "orders", "--as-of", "99")
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: as_of=99 is in the future")
    assert len(result.stderr.strip().splitlines()) == 1
    bad = run(tmp_path, "append", stdin='{"op": "insert", "t": 1}\n')
    assert bad.returncode == 1 and "missing field" in bad.stderr
    assert run(tmp_path, "no-such-command").returncode == 2


def test_maintenance_commands(tmp_path):
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in EVENTS) + "\n")
    run(tmp_path, "compact", "--in-process")
    assert run(tmp_path, "verify").returncode == 0
    exported = run(tmp_path, "export", "--as-of", "4", "--to", str(tmp_path / "backup"))
    assert exported.returncode == 0 and json.loads(exported.stdout)["tables"] == ["orders"]
    retained = run(tmp_path, "retain", "3", "--cold-tier", str(tmp_path / "cold"))
    assert retained.returncode == 0 and json.loads(retained.stdout)["files_removed"] == 1
    assert run(tmp_path, "load", "orders", "--as-of", "2").returncode == 1
    assert "earliest answerable as_of is now 0" in run(tmp_path, "load-cold-tier", str(tmp_path / "cold")).stdout
    assert run(tmp_path, "load", "orders", "--as-of", "3", "--format", "json").stdout.strip() == (
        '{"synthetic_key": 1, "amount": "12.50"}'
    )
    assert "rebuilt" in run(tmp_path, "rebuild-catalog").stdout
    assert json.loads(run(tmp_path, "cleanup").stdout)["tombstones_deleted"] == 0


def test_quarantine_then_release_after_a_fix(tmp_path):
    bad = EVENTS[:2] + [{"op": "update", "t": 3, "table_uuid": "T", "key": 99, "values": {"a": "1.00"}},
                        {"op": "close", "t": 3}]
    run(tmp_path, "append", "--seal", stdin="\n".join(json.dumps(e) for e in bad) + "\n")
    failed = run(tmp_path, "compact", "--in-process")
    assert failed.returncode == 1 and "update of key 99, which does not exist" in failed.stderr
    assert "quarantined" in run(tmp_path, "segments").stdout
    segment = next(Path(tmp_path).rglob("quarantine/*.sealed"))
    lines = segment.read_text().splitlines()
    fixed = [line.replace('"key":99', '"key":1') for line in lines[:-1]]
    from history_pipeline.wal.segments import sealing_line

    body = ("\n".join(fixed) + "\n").encode()
    segment.write_bytes(body + sealing_line(3, body))  # the operator's fix, re-sealed
    assert run(tmp_path, "release", "1").returncode == 0
    assert json.loads(run(tmp_path, "compact", "--in-process").stdout)["frontier"] == 3
