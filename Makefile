# Every target installs what it needs into .venv first; only Python >= 3.11 and the OS are assumed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,embedded]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bgq demo

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check bgq tests tools
	$(BIN)/ruff format --check bgq tests tools
	$(BIN)/sqlfluff lint db/mysql --dialect mysql
	$(BIN)/sqlfluff lint db/postgres --dialect postgres

bench: $(STAMP)
	$(BIN)/python tools/head_timing.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
