# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
SAMPLE ?= sample_models/transformer_block.onnx
# a real engine setting that breaks FP32 tolerance on the sample: there is a culprit to find
RUN_ARGS ?= --ort-config optimization.enable_gelu_approximation=1

.PHONY: run test samples bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

samples: $(STAMP)
	$(PY) sample_models/build.py

# bytecode, as a non-editable pip install writes it (also where PYTHONDONTWRITEBYTECODE is set):
# 0.1 s of every command is compiling bisect_tui's own modules otherwise
COMPILE := $(PY) -m compileall -q bisect_tui

run: $(STAMP)
	@$(COMPILE)
	@test -f $(SAMPLE) || $(PY) sample_models/build.py -q
	$(VENV)/bin/bisect-tui tui $(SAMPLE) $(RUN_ARGS)

# two pytest workers (pytest-xdist): CI has two cores; `pytest` alone runs the same tests serially
test: $(TEST_STAMP)
	$(PY) sample_models/build.py -q
	$(PY) -m pytest -q -n 2

bench: $(TEST_STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	@$(COMPILE)
	$(PY) sample_models/build.py -q
	$(PY) bench/baseline_memory.py
	$(PY) bench/bisect_vs_debug_reduce.py
	$(PY) bench/speed_at_scale.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
