VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint

$(PY):
	python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

setup: $(PY)
	$(PY) -m pip install -q -e '.[dev]'

demo: setup
	$(VENV)/bin/history-pipeline demo --root data

test: setup
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/ruff check .
