"""The core never imports Dagster: only history_pipeline.orchestration does."""

import pkgutil
import subprocess
import sys

import history_pipeline


def test_core_modules_do_not_import_dagster():
    core = [
        m.name
        for m in pkgutil.walk_packages(history_pipeline.__path__, "history_pipeline.")
        if not m.name.startswith("history_pipeline.orchestration")
    ]
    code = "import sys\n" + "".join(f"import {name}\n" for name in core) + "print('dagster' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert len(core) > 15
