"""The README's examples run as shown.

Every fenced code block of README.md is preceded by ``<!-- run -->`` or ``<!-- not run: why -->``.
The ``run`` blocks are executed in order, in an empty directory, on the sample workload the tour
itself writes: shell lines through the CLI's ``main`` in this process (the same code as the
console script, without a process start per line) or, when they use pipes, redirections or
here-documents, through ``bash`` with the environment's ``bin`` first on PATH; ``pycon`` blocks
as doctests, so the outputs shown are the outputs produced. A README that drifts from the code
fails here. The server configuration the README writes is loaded as ``serve`` loads it; a test of
the ``daemon`` tier starts the server as shown and runs the README's client code against it.
"""

from __future__ import annotations

import doctest
import hashlib
import os
import re
import select
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from history_pipeline import HistoryStore, cli
from history_pipeline.service.config import load_config

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MARKER = re.compile(r"^<!-- (run|not run: .+) -->$")
FENCE = re.compile(r"^```(\w*)\s*$")
HEREDOC = re.compile(r"<<\s*'?(\w+)'?\s*$")
SHELL_SYNTAX = set("|<>$`;")
# What a command prints when it found nothing: a tour line must show something.
EMPTY_ANSWERS = (re.compile(r"\(0 rows\)"), re.compile(r"\b0 inserted, 0 deleted, 0 changed"))


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README: its language, text, first line and marker."""

    language: str
    text: str
    line: int
    marker: str | None
    section: str


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, each with the marker on the line before it."""
    blocks: list[Block] = []
    lines = text.splitlines()
    section, i = "", 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:].strip()
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        found = MARKER.match(before.strip())
        blocks.append(Block(opening.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 2,
                            found.group(1) if found else None, section))
        i = end + 1
    return blocks


def shell_commands(text: str) -> list[str]:
    """A shell block's commands: one per line, a here-document with its body as one command."""
    commands: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        heredoc = HEREDOC.search(line)
        if heredoc:
            end = lines.index(heredoc.group(1), i + 1)
            commands.append("\n".join(lines[i:end + 1]))
            i = end + 1
            continue
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line)
        i += 1
    return commands


class Tour:
    """Runs the README's shell commands in a working directory, failing on any error."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str]):
        self.cwd = root
        self.capsys = capsys

    def run(self, command: str, where: str) -> str:
        for part in command.split("&&") if "<<" not in command else [command]:
            self.run_one(part.strip(), where)
        return ""

    def run_one(self, command: str, where: str) -> None:
        words = shlex.split(command, comments=True) if "<<" not in command else []
        if words[:2] == [".", ".venv/bin/activate"]:
            # The Makefile's environment: the test already runs inside it.
            assert "VENV ?= .venv" in (REPO / "Makefile").read_text(), where
            assert Path(sys.executable).parent.joinpath("history-pipeline").exists(), where
            return
        if words[:2] == ["mkdir", "-p"] and len(words) == 3:
            (self.cwd / words[2]).mkdir(parents=True, exist_ok=True)
            return
        if words[:1] == ["cd"] and len(words) == 2:
            self.cwd = self.cwd / words[1]
            assert self.cwd.is_dir(), f"{where}: no directory {self.cwd}"
            return
        if words[:1] == ["history-pipeline"] and not SHELL_SYNTAX & set(command.split("#")[0]):
            self.run_cli(words[1:], where)
            return
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{where}: `{command}` failed:\n{done.stdout}\n{done.stderr}"
        self.check_answer(done.stdout, command, where)

    def run_cli(self, argv: list[str], where: str) -> None:
        self.capsys.readouterr()
        before = Path.cwd()
        os.chdir(self.cwd)
        try:
            code = cli.main(argv)
        finally:
            os.chdir(before)
        out, err = self.capsys.readouterr()
        assert code == 0, f"{where}: `history-pipeline {shlex.join(argv)}` exited {code}:\n{out}\n{err}"
        self.check_answer(out, "history-pipeline " + shlex.join(argv), where)

    @staticmethod
    def check_answer(out: str, command: str, where: str) -> None:
        if "<<" in command or ">" in command:
            return  # writes a file; what it wrote is checked by the lines that read it
        assert out.strip(), f"{where}: `{command}` printed nothing"
        for empty in EMPTY_ANSWERS:
            assert not empty.search(out), f"{where}: `{command}` found nothing:\n{out}"


def test_every_block_says_whether_it_runs():
    blocks = readme_blocks(README.read_text())
    unmarked = [f"README.md:{b.line}" for b in blocks if b.marker is None]
    assert not unmarked, f"blocks without <!-- run --> or <!-- not run: why -->: {unmarked}"
    tour = [b for b in blocks if b.section == "A tour"]
    assert tour and all(b.marker == "run" for b in tour), "every block of the tour runs"
    assert all(b.language in ("bash", "pycon", "python") for b in blocks if b.marker == "run")


def test_the_first_screen_has_the_two_commands():
    first = readme_blocks(README.read_text())[0]
    commands = [shlex.split(c, comments=True) for c in shell_commands(first.text)]
    assert commands == [["make", "demo"], ["make", "test"]]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def run_readme(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Tour, int]:
    """Run every ``run`` block of the README in order under ``root``; the tour and how many
    commands and examples ran."""
    tour = Tour(root, capsys)
    ran = 0
    for block in readme_blocks(README.read_text()):
        if block.marker != "run":
            continue
        if block.language == "bash":
            for command in shell_commands(block.text):
                tour.run(command, f"README.md:{block.line}")
                ran += 1
        else:
            parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            source = block.text if block.language == "pycon" else ">>> exec(" + repr(block.text) + ")\n"
            test = parser.get_doctest(source, {}, f"README.md:{block.line}", str(README), block.line)
            before = Path.cwd()
            os.chdir(tour.cwd)
            try:
                runner.run(test, out=print)
            finally:
                os.chdir(before)
            report = capsys.readouterr().out
            assert runner.failures == 0 and test.examples, f"README.md:{block.line}:\n{report}"
            ran += len(test.examples)
    return tour, ran


def test_the_readme_runs_as_shown(tmp_path, capsys):
    tour, ran = run_readme(tmp_path, capsys)
    assert ran >= 20
    # The server configuration written by the tour is valid and admits the token it printed.
    config = load_config(tour.cwd / "server.toml")
    token = (tour.cwd / "token.txt").read_text().split()[1]
    assert [t.token_sha256 for t in config.tenants] == [hashlib.sha256(token.encode()).hexdigest()]
    assert "history-pipeline serve --config server.toml" in README.read_text()


@pytest.mark.daemon
def test_the_readme_server_answers_the_readme_client(tmp_path, capsys):
    """The server started as the README shows (on a free port instead of 8815) answers the
    README's client code as the store does in-process."""
    tour, _ = run_readme(tmp_path, capsys)
    blocks = readme_blocks(README.read_text())
    serve = next(b for b in blocks if b.language == "bash" and "serve --config" in b.text)
    client = next(b for b in blocks if b.language == "python" and "connect(" in b.text)
    argv = shlex.split(shell_commands(serve.text)[0], comments=True)
    assert argv[:2] == ["history-pipeline", "serve"]
    script = Path(sys.executable).parent / "history-pipeline"
    server = subprocess.Popen([str(script), *argv[1:], "--port", "0", "--workers", "1"], cwd=tour.cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        ready, _, _ = select.select([server.stdout], [], [], 120)
        line = server.stdout.readline() if ready else ""
        assert line.startswith("serving "), f"the server did not start: {line!r} {server.poll()}"
        url = line.split()[-1]
        code = client.text.replace('"grpc://127.0.0.1:8815"', repr(url))
        assert code != client.text, "the client block no longer connects to the configured port"
        namespace: dict = {}
        before = Path.cwd()
        os.chdir(tour.cwd)
        try:
            exec(compile(code, f"README.md:{client.line}", "exec"), namespace)
        finally:
            os.chdir(before)
        namespace["history"].close()
        local = HistoryStore.open(tour.cwd / "data", database="tenant_a", create=False)
        assert namespace["before"] == local.fetch_row("orders", 10000, as_of=505)
        expected = local.sql("SELECT state, sum(amount) FROM orders GROUP BY state", as_of=4000)
        assert namespace["totals"].sort_by("state").equals(expected.sort_by("state"))
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_make_demo_sets_aside_only_dagster_devs_supersession_warning():
    import warnings

    from dagster._symbol_annotations.lifecycle import superseded

    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\ndemo:"):makefile.index("\n\n", makefile.index("\ndemo:"))]
    (text,) = re.findall(r"-W 'ignore:([^']+)'", recipe)
    assert recipe.index("-W") < recipe.index("dagster dev")  # the filter is dagster dev's own

    def command() -> None:
        return None

    command.__qualname__ = "dev_command"  # declared as dagster declares its `dagster dev` command
    dev_command = superseded(additional_warn_text="Use 'dg dev' instead.", emit_runtime_warning=True)(command)

    for set_aside in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if set_aside:  # what `python -W 'ignore:TEXT'` installs: TEXT matched literally at the start
                warnings.filterwarnings("ignore", message=re.escape(text))
            dev_command()
            warnings.warn("another warning still shows", UserWarning, stacklevel=1)
        messages = [str(w.message) for w in caught]
        assert "another warning still shows" in messages
        assert any("dg dev" in m for m in messages) is not set_aside, messages
