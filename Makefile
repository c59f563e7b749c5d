# The two commands people run are `make demo` and `make test`; each sets up
# what it needs (scripts/bootstrap) the first time.  Everything builds with
# Meson: the Python package goes through meson-python (`pip install .`), into
# the project's .venv, reusing build/ so rebuilds are incremental.

VENV    := .venv
PY      := $(VENV)/bin/python
MESON   := $(VENV)/bin/meson
BUILD   := build
ASAN    := build-sanitize
PYTEST  := $(PY) -m pytest
# The test producer extension lives in the build tree, never installed.
TESTPATH := $(CURDIR)/$(BUILD)/src/python

.PHONY: all bootstrap build test fuzz fuzz-short test-layering test-c test-valgrind test-python sanitize \
        test-install sanitize-python test-py312 demo bench clean

all: build

bootstrap:
	@scripts/bootstrap

build: bootstrap
	@$(PY) -m pip install -q --no-build-isolation --no-deps \
	    -Cbuild-dir=$(BUILD) . 2>&1 | grep -v '^$$' || true
	@$(PY) -c 'import dlbridge' || { echo "build failed: see above"; exit 1; }

test: build test-layering test-c test-valgrind sanitize fuzz-short test-install test-python test-py312 sanitize-python

# libFuzzer targets (tests/fuzz) built with clang, ASan and UBSan: `make
# fuzz` runs each for FUZZ_SECONDS (60), `make test` a 10-second pass.
fuzz: bootstrap
	@scripts/fuzz

fuzz-short: bootstrap
	@FUZZ_SECONDS=10 scripts/fuzz

# src/python's files form a DAG in the order of dlbridge_py.h's file map.
test-layering:
	@python3 scripts/check-layering

test-c: build
	@$(MESON) test -C $(BUILD) --suite c --print-errorlogs -q

# memcheck: any leak or invalid access fails the run (exit code 99).
test-valgrind: build
	@$(MESON) test -C $(BUILD) --suite c --setup valgrind --print-errorlogs -q
	@echo "valgrind memcheck, per C test program:"
	@grep -h -A1 -E "(ERROR SUMMARY|All heap blocks were freed)" \
	    $(BUILD)/meson-logs/testlog-valgrind.txt | grep -v '^--' | sed 's/^==[0-9]*==/ /'

# ASan + UBSan build of the C library and its tests; any report is fatal.
sanitize: bootstrap
	@[ -f $(ASAN)/build.ninja ] || $(MESON) setup $(ASAN) -Dpython=false \
	    -Db_sanitize=address,undefined -Db_lundef=false \
	    -Dc_args=-fno-sanitize-recover=all -Dbuildtype=debug >/dev/null
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    $(MESON) test -C $(ASAN) --suite c --print-errorlogs -q

# The extension and the test producer built with ASan + UBSan, and the whole
# Python suite run against them with the runtimes preloaded into the
# interpreter.  Leak detection is off (CPython keeps memory until exit);
# a small quarantine keeps RSS-growth checks meaningful; new/delete
# mismatches are off because PaddlePaddle has one of its own (our code is C).
# PaddlePaddle's import crashes under an ASan preload, so its test runs only
# in the plain pass.  --capture=sys leaves file descriptor 2 alone, so a
# sanitizer report reaches the terminal even when it aborts the process.
SANPY   := build-sanitize-py
SANLIBS := $(shell gcc -print-file-name=libasan.so):$(shell gcc -print-file-name=libubsan.so)
sanitize-python: bootstrap
	@[ -f $(SANPY)/build.ninja ] || $(MESON) setup $(SANPY) \
	    -Db_sanitize=address,undefined -Db_lundef=false \
	    -Dc_args=-fno-sanitize-recover=all -Dbuildtype=debug >/dev/null
	@$(VENV)/bin/ninja -C $(SANPY) >/dev/null
	@rm -rf $(SANPY)/stage && mkdir -p $(SANPY)/stage/dlbridge/include
	@cp python/dlbridge/*.py python/dlbridge/*.pyi $(SANPY)/stage/dlbridge/
	@cp -r include/dlbridge include/dlpack $(SANPY)/stage/dlbridge/include/
	@ln -s $(CURDIR)/$(SANPY)/src/python/$$(cd $(SANPY)/src/python && ls _core*.so) \
	    $(SANPY)/stage/dlbridge/
	@echo "pytest against the ASan + UBSan build of the extension:"
	@LD_PRELOAD=$(SANLIBS) \
	    ASAN_OPTIONS=detect_leaks=0:alloc_dealloc_mismatch=0:quarantine_size_mb=4 \
	    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	    PYTHONPATH=$(SANPY)/stage:$(SANPY)/src/python:$(SANPY)/examples/extension \
	    $(PYTEST) -q -p no:cacheprovider --capture=sys tests/python -k "not paddle"

# Install libdlbridge into a scratch prefix and build the C demo against it
# through pkg-config, as a C user would; then run it against the shared lib.
INSTALL_PREFIX := $(CURDIR)/build-install/prefix
test-install: bootstrap
	@[ -f build-install/build.ninja ] || $(MESON) setup build-install \
	    -Dpython=false -Dtests=false --prefix=$(INSTALL_PREFIX) \
	    --libdir=lib >/dev/null
	@$(MESON) install -C build-install --quiet >/dev/null
	@PKG_CONFIG_PATH=$(INSTALL_PREFIX)/lib/pkgconfig sh -c \
	    'cc -std=c11 -Wall -Wextra -Werror examples/demo_c.c \
	     $$(pkg-config --cflags --libs dlbridge) -o build-install/demo_c'
	@LD_LIBRARY_PATH=$(INSTALL_PREFIX)/lib build-install/demo_c >/dev/null
	@echo "install: headers, libdlbridge and dlbridge.pc installed; demo_c built with pkg-config and ran"

test-python: build
	@PYTHONPATH=$(TESTPATH) $(PYTEST) -q tests/python

# The compiled-call tests again on Python 3.12 with the newest JAX
# (requirements/py312.txt; the .venv's JAX 0.10.2 is the last for 3.11): the
# extension built for pyenv's newest 3.12 (else python3.12 on PATH) into
# $(BUILD312), installed into $(VENV312).  Skipped, saying so, without one.
VENV312  := .venv312
BUILD312 := build-py312
PY312_REQ := requirements/build.txt requirements/py312.txt
test-py312: build
	@py=$$(ls -d "$$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3 2>/dev/null \
	       | sort -V | tail -n 1); \
	 [ -n "$$py" ] || py=$$(command -v python3.12 || true); \
	 if [ -z "$$py" ]; then \
	   echo "test-py312: skipped: no Python 3.12 (pyenv install 3.12, or python3.12 on PATH)"; \
	   exit 0; fi; \
	 want=$$(cat $(PY312_REQ) | sha256sum | cut -d' ' -f1); \
	 if [ ! -x $(VENV312)/bin/python ] || \
	    [ "$$want" != "$$(cat $(VENV312)/.requirements.sha256 2>/dev/null)" ]; then \
	   echo "test-py312: installing requirements/py312.txt into $(VENV312) ($$($$py --version))"; \
	   { [ -x $(VENV312)/bin/python ] || $$py -m venv $(VENV312); } && \
	   if $(VENV312)/bin/python -m pip install -q -r requirements/py312.txt \
	        >$(VENV312)/.pip.log 2>&1; then echo "$$want" > $(VENV312)/.requirements.sha256; \
	   else grep -v '^WARNING: Location' $(VENV312)/.pip.log; exit 1; fi; \
	 fi; \
	 $(VENV312)/bin/python -m pip install -q --no-build-isolation --no-deps \
	     -Cbuild-dir=$(BUILD312) . >$(VENV312)/.build.log 2>&1 || \
	   { grep -v '^WARNING: Location' $(VENV312)/.build.log; exit 1; }; \
	 echo "test-py312: $$($(VENV312)/bin/python --version), jax $$($(VENV312)/bin/python -c 'import jax; print(jax.__version__)')"; \
	 PYTHONPATH=$(CURDIR)/$(BUILD312)/src/python $(VENV312)/bin/python -m pytest -q \
	     -p no:cacheprovider tests/python/test_compiled_jax.py tests/python/test_compiled.py

demo: build
	@echo "== dlbridge doctor: every installed framework against every other =="
	@mkdir -p build
	@$(PY) -m dlbridge doctor --html build/doctor.html --json build/doctor.json || true
	@echo
	@echo "== libdlbridge from C (examples/demo_c.c) =="
	@$(BUILD)/demo_c
	@echo
	@echo "== through Python: NumPy and torch via dlbridge and back (examples/demo.py) =="
	@$(PY) examples/demo.py
	@echo
	@echo "== one C kernel, every framework: dlb.load + dlb.Function (examples/function_demo.py) =="
	@$(PY) examples/function_demo.py $(BUILD)/libdlb_example_kernels.so
	@echo
	@echo "== a C extension using dlbridge's C API (examples/extension_demo.py) =="
	@PYTHONPATH=$(BUILD)/examples/extension $(PY) examples/extension_demo.py
	@echo
	@echo "doctor report: $(CURDIR)/build/doctor.html"

# Benchmarks, never part of `make test`: the peers (nanobind, tvm-ffi; pinned
# in requirements/bench.txt, installed on first use and whenever that file
# changes) are built into $(BUILD)/bench, then the copy and call benchmarks
# run, then `dlbridge bench` with those peers (their rows next to each
# framework's own path).  They print figures and PASS/MISS against the
# targets; a MISS never fails the run.
BENCH_REQ   := requirements/bench.txt
BENCH_STAMP := $(VENV)/.bench-requirements.sha256
bench: build
	@want=$$(sha256sum $(BENCH_REQ) | cut -d' ' -f1); \
	 if [ "$$want" != "$$(cat $(BENCH_STAMP) 2>/dev/null)" ]; then \
	   echo "bench: installing $(BENCH_REQ) into $(VENV)"; \
	   if $(PY) -m pip install -q -r $(BENCH_REQ) >$(VENV)/.bench-pip.log 2>&1; \
	   then echo "$$want" > $(BENCH_STAMP); \
	   else grep -v '^WARNING: Location' $(VENV)/.bench-pip.log; \
	     echo "bench: pip failed; peers that are missing will be skipped"; fi; \
	 fi
	@PY=$(PY) bench/build_peers.sh
	@echo "== copies (build/bench_copy) =="
	@$(BUILD)/bench_copy
	@echo
	@echo "== calls, from_dlpack, convert, __dlpack__, memory (bench/bench_calls.py) =="
	@$(PY) bench/bench_calls.py
	@echo; echo "== every installed framework against its own path (dlbridge bench, docs/bench.md) =="
	@$(PY) -m dlbridge bench --plain --peers $(BUILD)/bench --kernels $(BUILD)/libdlb_example_kernels.so
	@echo; echo "== scale-out: pickle-5, shared memory, multiprocessing, MPI (bench/bench_scaleout.py) =="; $(PY) bench/bench_scaleout.py
	@echo; echo "== a Function as a torch operator, eager and compiled (bench/bench_torch_ops.py) =="; $(PY) bench/bench_torch_ops.py
	@echo; echo "== compiled: a Function as a compiler's op (bench/bench_compiled.py) =="; $(PY) bench/bench_compiled.py

clean:
	rm -rf $(BUILD) $(ASAN)
