"""Running the console script's commands in the test process.

A command runs through ``history_pipeline.cli.main``, the console script's entry point, with its
own stdin, stdout and stderr (text over bytes, as a process has them) and its exit code, argparse's
included; what it saves is a process's seconds of imports and, for the commands that run on Spark,
a JVM of its own (they get the test run's session). ``SCRIPT`` is the installed script itself, for
the tests of what only a process shows (the interpreter's exit, an environment of its own)."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from history_pipeline.cli import main

SCRIPT = str(Path(sys.executable).parent / "history-pipeline")


def run_command(argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``history-pipeline *argv`` in this process: its exit code, stdout and stderr."""
    streams = {name: io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for name in ("stdout", "stderr")}
    given = io.TextIOWrapper(io.BytesIO((stdin or "").encode()), encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = given, streams["stdout"], streams["stderr"]
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's usage errors and --help
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    text = {}
    for name, stream in streams.items():
        stream.flush()
        text[name] = stream.buffer.getvalue().decode()
    return subprocess.CompletedProcess(list(argv), code, text["stdout"], text["stderr"])
