# segstore: `make demo` and `make test` are the whole quick start. Each sets up .venv itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.segstore-installed
DEBUG_DIR := build/debug
CORE_SRC := segstore/_core.pyx segstore/_core.pxd $(wildcard segstore/*.pxi) setup.py pyproject.toml

.PHONY: install demo test test-fast test-debug debug-build bench bench-full spark-matrix clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Build tools first, so the editable build can skip build isolation and rebuilds stay fast.
$(STAMP): $(PY) $(CORE_SRC)
	$(PIP) install -q "setuptools>=74" "Cython>=3.0" wheel
	$(PIP) install -q --no-build-isolation -e ".[test,spark,bench]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) examples/cdc_pipeline.py

# The whole suite on the optimized build, then again on the debug build
# (bounds and wraparound checks on), so an out-of-bounds read fails loudly. -P keeps the source
# tree (the optimized build) off sys.path so PYTHONPATH's debug copy is the one imported.
test: install debug-build
	$(PY) -m pytest -q -p no:cacheprovider
	PYTHONPATH=$(DEBUG_DIR) SEGSTORE_EXPECT_DEBUG=1 $(PY) -P -m pytest -q -p no:cacheprovider -m "not spark and not slow" tests

test-fast: install
	$(PY) -m pytest -q -x -p no:cacheprovider -m "not slow and not spark"

$(DEBUG_DIR)/.built: $(STAMP) $(wildcard segstore/*.py segstore/*/*.py)
	rm -rf $(DEBUG_DIR)
	SEGSTORE_CYTHON_DEBUG=1 $(PY) setup.py -q build_ext --force --build-lib $(DEBUG_DIR) --build-temp build/debug-tmp
	cp segstore/*.py segstore/*.pyi $(DEBUG_DIR)/segstore/
	for d in segstore/*/; do case $$d in *__pycache__*) ;; *) mkdir -p $(DEBUG_DIR)/$$d && cp $$d*.py $(DEBUG_DIR)/$$d ;; esac; done
	touch $@

debug-build: $(DEBUG_DIR)/.built

# tests/spark (and docs/spark.md's examples) on other pyspark versions than .venv's, one venv
# each under build/spark-matrix, made on first use. SPARK_MATRIX="4.0.5 4.3.0" picks versions;
# the default is tools/spark_matrix.py's list. Not part of `make test`: it takes ~10 minutes.
SPARK_MATRIX ?=
spark-matrix: install
	$(PY) tools/spark_matrix.py $(SPARK_MATRIX)

bench: install
	cd asv_bench && ../$(PY) -m asv machine --yes >/dev/null && \
	  ../$(PY) -m asv check --python=same && \
	  ../$(PY) -m asv run --python=same --quick --show-stderr

bench-full: install
	cd asv_bench && ../$(PY) -m asv machine --yes >/dev/null && \
	  ../$(PY) -m asv run --python=same --show-stderr

clean:
	rm -rf build $(VENV) segstore/_core.c segstore/*.so asv_bench/.asv
