# segstore: `make demo` and `make test` are the whole quick start. Each sets up .venv itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.segstore-installed
DEBUG_DIR := build/debug
ASAN_DIR := build/asan
CORE_SRC := segstore/_core.pyx segstore/_core.pxd $(wildcard segstore/*.pxi) setup.py pyproject.toml

.PHONY: install demo test test-fast test-debug debug-build test-asan asan-build bench bench-full \
	spark-matrix clean

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

# The suites that feed the core hostile or damaged bytes, on a build of the optimized C compiled
# with AddressSanitizer (SEGSTORE_ASAN=1): a read past a buffer that no Cython check sees (raw
# pointers, memcpy, the nogil kernels) stops the run with ASan's report. The interpreter is not
# instrumented, so ASan's runtime is preloaded; PYTHONMALLOC=malloc makes every Python object a
# guarded malloc block. Needs gcc's libasan; not part of `make test` (about five minutes).
# SEGSTORE_ASAN_FUZZ_EXAMPLES=N runs tests/test_asan_fuzz.py longer.
ASAN_CC ?= gcc
ASAN_TESTS := tests/test_asan_fuzz.py tests/test_damage.py tests/test_log_damage.py \
	tests/test_log_damage_max_records.py tests/test_core_codec.py tests/test_decode_changed.py \
	tests/test_decode_review.py tests/test_decode_split.py tests/test_decode_predicted.py \
	tests/test_decode_release.py \
	tests/test_varint_readers.py tests/test_find_batch.py tests/test_index.py tests/test_verify.py \
	tests/test_cleaner_crc.py tests/test_readonly_crc.py tests/test_compression.py \
	tests/test_offset_map.py tests/test_stream_out.py tests/test_kafka_file_compat.py \
	tests/test_codec_arguments.py tests/test_codec_debug_build.py tests/test_asan_regressions.py

$(ASAN_DIR)/.built: $(STAMP) $(wildcard segstore/*.py segstore/*/*.py)
	rm -rf $(ASAN_DIR)
	SEGSTORE_ASAN=1 $(PY) setup.py -q build_ext --force --build-lib $(ASAN_DIR) --build-temp build/asan-tmp
	cp segstore/*.py segstore/*.pyi $(ASAN_DIR)/segstore/
	for d in segstore/*/; do case $$d in *__pycache__*) ;; *) mkdir -p $(ASAN_DIR)/$$d && cp $$d*.py $(ASAN_DIR)/$$d ;; esac; done
	touch $@

asan-build: $(ASAN_DIR)/.built

test-asan: install asan-build
	PYTHONPATH=$(ASAN_DIR) SEGSTORE_EXPECT_ASAN=1 LD_PRELOAD=$$($(ASAN_CC) -print-file-name=libasan.so) \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 PYTHONMALLOC=malloc \
	  $(PY) -P -m pytest -q -p no:cacheprovider $(ASAN_TESTS)

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
