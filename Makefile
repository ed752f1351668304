VENV ?= .venv
PY := $(VENV)/bin/python
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup demo check test lint bench bench-quick bench-setup

$(PY):
	python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

setup: $(PY)
	$(PY) -m pip install -q -e '.[dev]'

# The main job on the embedded default: sample segments into data/, the Spark engine (a local Spark
# Connect server, left running: `history-pipeline engine stop`), then the Dagster UI and daemon,
# whose sensor compacts every sealed segment on the engine (open http://127.0.0.1:3000 to watch).
# `dagster dev` warns on every start that `dg dev` supersedes it (which needs a dg project and
# the dagster-dg-cli package): that one warning is set aside by its text, in dagster dev's process only
demo: setup
	$(VENV)/bin/history-pipeline --root data sample
	$(VENV)/bin/history-pipeline --root data engine start
	mkdir -p $(DAGSTER_HOME) && cp dagster.yaml $(DAGSTER_HOME)/
	HISTORY_PIPELINE_SPARK=$$($(PY) -c "from history_pipeline.engine import engine_dir, running_engine; print(running_engine(engine_dir('data')).url)") \
	$(PY) -c "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])" \
		$(PY) -W 'ignore:Function `dev_command` is superseded' \
		$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# The fast tier for every edit: unit and property tests, no JVM, daemon, PostgreSQL or S3.
check: setup
	HISTORY_TEST_TIER=check $(VENV)/bin/pytest -q -n 2 -m "not slow and not spark and not s3 and not postgres and not daemon and not jvm"

# Everything, what CI runs. Three workers on two cores: the JVM, daemon and server tests spend much
# of their time waiting on their processes, so a third worker fills the cores (10.5 min against
# 11.8 with two on the same machine).
test: setup
	$(VENV)/bin/pytest -q -n 3 --dist worksteal

lint: setup
	$(VENV)/bin/ruff check .

bench-setup: setup
	$(PY) -m pip install -q -e '.[dev,bench]'

bench-quick: bench-setup
	$(PY) -m bench.run --quick

bench: bench-setup
	$(PY) -m bench.run
