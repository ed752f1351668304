"""Benchmarks of history_pipeline, each beside a baseline measured in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def provenance() -> str:
    """One line dating a measurement: UTC time, the commit measured (``+`` when the tree had
    changes) and the command that ran, for the head of a results file."""
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", ""
    command = " ".join(["python -m bench." + Path(sys.argv[0]).stem, *sys.argv[1:]])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"Measured {when} on commit {commit}{'+' if dirty else ''}: `{command}`."


def write_results(name: str, results: Any, table: str, dated: bool = False) -> None:
    """``bench/results/<name>.json`` (the figures) and ``<name>.md`` (the table under its provenance
    line, or alone when it is ``dated``: it names its date, commit and command itself)."""
    line = provenance()  # before writing: the results files themselves do not make the tree changed
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2, default=str))
    (RESULTS / f"{name}.md").write_text(table if dated else line + "\n\n" + table)
