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
        test-outside \
        test-install sanitize-python demo bench bench-scaling clean test-py312 test-py313 \
        test-py314 test-py315 test-ft test-py315t test-tsan test-pycompat wheel wheel-smoke

all: build

bootstrap:
	@scripts/bootstrap

build: bootstrap
	@$(PY) -m pip install -q --no-build-isolation --no-deps \
	    -Cbuild-dir=$(BUILD) . 2>&1 | grep -v '^$$' || true
	@$(PY) -c 'import dlbridge' || { echo "build failed: see above"; exit 1; }

# `make test` runs these stages in this order, each in its own make, and
# prints each stage's wall time as it ends and all of them at the end; the
# first stage that fails stops the run, as before.  The stages after `build`
# skip their own `build` prerequisite (STAGED=1): it has just run.
TEST_STAGES := build test-layering test-c test-valgrind sanitize fuzz-short \
               test-install test-python test-outside test-py312 test-py313 \
               test-py314 test-py315 test-ft test-py315t test-tsan \
               sanitize-python
BUILT_DEP := $(if $(STAGED),,build)
test:
	@times=""; all=$$(date +%s%N); \
	for stage in $(TEST_STAGES); do \
	  t0=$$(date +%s%N); \
	  $(MAKE) --no-print-directory $$stage STAGED=1; rc=$$?; \
	  ms=$$(( ($$(date +%s%N) - t0) / 1000000 )); \
	  line=$$(printf '%-16s %5d.%d s' $$stage $$((ms / 1000)) $$((ms % 1000 / 100))); \
	  echo "== stage $$line$$([ $$rc -eq 0 ] || echo '  FAILED')"; \
	  times="$$times  $$line\n"; \
	  [ $$rc -eq 0 ] || { printf "== stage times (stopped at $$stage):\n$$times"; exit $$rc; }; \
	done; \
	ms=$$(( ($$(date +%s%N) - all) / 1000000 )); \
	printf "== stage times:\n$$times  %-16s %5d.%d s\n" total $$((ms / 1000)) $$((ms % 1000 / 100))

# libFuzzer targets (tests/fuzz) built with clang, ASan and UBSan: `make
# fuzz` runs each for FUZZ_SECONDS (60), `make test` a 10-second pass.
fuzz: bootstrap
	@scripts/fuzz

fuzz-short: bootstrap
	@FUZZ_SECONDS=10 scripts/fuzz

# src/python's files form a DAG in the order of dlbridge_py.h's file map.
test-layering:
	@python3 scripts/check-layering

test-c: $(BUILT_DEP)
	@$(MESON) test -C $(BUILD) --suite c --print-errorlogs -q

# memcheck: any leak or invalid access fails the run (exit code 99).
test-valgrind: $(BUILT_DEP)
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

# The extension built with the public fallback of every private CPython API
# it uses (src/python/pycompat.h, -Dpycompat_public_only=true), and the
# tests that reach those fallbacks run against it: test_pycompat checks the
# build is that one and pins the fallbacks' answers; the export (deleters on
# threads without Python), exchange and import (type lookups, version tags,
# optional attributes) and Function (torch's descriptors) suites use them.
PCBUILD := build-pycompat
PYCOMPAT_TESTS := tests/python/test_pycompat.py tests/python/test_export.py \
                  tests/python/test_exchange.py tests/python/test_import.py \
                  tests/python/test_function.py
test-pycompat: bootstrap
	@[ -f $(PCBUILD)/build.ninja ] || $(MESON) setup $(PCBUILD) \
	    -Dpycompat_public_only=true -Dbuildtype=release >/dev/null
	@$(VENV)/bin/ninja -C $(PCBUILD) >/dev/null
	@rm -rf $(PCBUILD)/stage && mkdir -p $(PCBUILD)/stage/dlbridge/include
	@cp python/dlbridge/*.py python/dlbridge/*.pyi $(PCBUILD)/stage/dlbridge/
	@cp -r include/dlbridge include/dlpack $(PCBUILD)/stage/dlbridge/include/
	@ln -s $(CURDIR)/$(PCBUILD)/src/python/$$(cd $(PCBUILD)/src/python && ls _core*.so) \
	    $(PCBUILD)/stage/dlbridge/
	@echo "pytest against the extension built with pycompat.h's public fallbacks:"
	@DLB_EXPECT_PYCOMPAT_PUBLIC_ONLY=1 \
	    DLB_EXAMPLE_KERNELS=$(CURDIR)/$(PCBUILD)/libdlb_example_kernels.so \
	    PYTHONPATH=$(PCBUILD)/stage:$(PCBUILD)/src/python:$(PCBUILD)/examples/extension \
	    $(PYTEST) -q -p no:cacheprovider $(PYCOMPAT_TESTS)

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

test-python: $(BUILT_DEP)
	@PYTHONPATH=$(TESTPATH) $(PYTEST) -q tests/python

# Other projects' own DLPack suites, shipped in their wheels, each run plain
# and with every tensor routed through dlbridge (tests/outside/run.py):
# NumPy's numpy/_core/tests/test_dlpack.py and Warp's
# warp.tests.interop.test_dlpack (skipped, saying so, without Warp).
test-outside: $(BUILT_DEP)
	@PYTHONPATH=$(TESTPATH) $(PY) tests/outside/run.py

# The Python suite on pyenv's 3.12 and 3.13, and on 3.14 and 3.15
# (scripts/python-build: sid's binary packages in a private prefix, cached),
# by scripts/python-suite (a venv, a build dir and requirements/pyXY.txt
# each): NumPy 2.5.5, JAX 0.12 (3.11's .venv keeps 0.10.2), array-api-strict,
# ml-dtypes 0.7; the heavy peers' tests skip there.  An interpreter this
# machine cannot get prints `not run: <reason>`.
test-py312:
	@scripts/python-suite 3.12

test-py313:
	@scripts/python-suite 3.13

test-py314:
	@scripts/python-suite 3.14

test-py315:
	@scripts/python-suite 3.15

# The newest free-threaded CPython this machine can get (3.14t where Debian
# serves its source, else 3.13t: scripts/python-suite --newest-ft says which
# and why): the Python suite there with the peers that have wheels for it,
# after checking that the GIL stays off once dlbridge and each peer are
# imported (a module without Py_MOD_GIL_NOT_USED turns it back on for the
# whole process, and the stage fails), then the thread hammer (tests/threads,
# 8 threads) with the GIL off.
test-ft:
	@ft=$$(scripts/python-suite --newest-ft) && scripts/python-suite $$ft \
	    && DLB_FT_VERSION=$$ft scripts/thread-hammer

# A smoke run on the free-threaded 3.15 (the GIL check and the export and
# import suites), or `not run` with the reason while no source for it is
# served.
test-py315t:
	@PYTEST_PATHS="tests/python/test_export.py tests/python/test_import.py" \
	    scripts/python-suite 3.15t

# The thread hammer under ThreadSanitizer, on test-ft's interpreter: the
# extension built with clang-14 and -fsanitize=thread, run by the
# ThreadSanitizer build of that free-threaded CPython (scripts/python-build
# VERSION --tsan) with only CPython's own free-threading suppressions; any
# report fails the stage (scripts/thread-hammer --tsan prints the count).
test-tsan:
	@ft=$$(scripts/python-suite --newest-ft) && DLB_FT_VERSION=$$ft scripts/thread-hammer --tsan

# Binary wheels and the sdist into dist/ (scripts/wheels): cp311-cp315 and
# a free-threaded wheel for each of cp313t/cp314t/cp315t the machine can get
# (scripts/python-build; one it cannot get prints `not built: <reason>`),
# all manylinux_2_28: compiled by zig cc for a glibc 2.28 baseline, and
# each .so's highest GLIBC_ symbol version checked.  wheel-smoke installs
# each into a fresh venv of its interpreter, peers from wheels only, with no
# compiler in reach (CC=false, compilers on PATH shadowed), and runs
# tests/wheel/smoke.py there (JAX's jit route, and tf.function on cp311);
# then the sdist, built by pip on 3.11.  Measured on 2 busy cores: wheel
# 2m53s-3m41s (6 wheels + sdist, interpreters cached), wheel-smoke 5m16s-7m07s
# (pip cache warm; 1m18s-1m46s of it the sdist: a venv with TensorFlow, its
# build).
wheel: bootstrap
	@scripts/wheels

wheel-smoke:
	@scripts/wheel-smoke

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
	@echo "== batch dimensions: one kernel call per batch, eager and under jax.vmap / torch.vmap (examples/batch_demo.py) =="
	@$(PY) examples/batch_demo.py $(BUILD)/libdlb_example_kernels.so
	@echo
	@echo "== the same Function inside jax.jit, torch.compile and tf.function (examples/compiled_demo.py) =="
	@TF_CPP_MIN_LOG_LEVEL=3 $(PY) examples/compiled_demo.py $(BUILD)/libdlb_example_kernels.so
	@echo
	@echo "== training through C kernels and their vjp in torch, JAX and TensorFlow (examples/train_demo.py) =="
	@TF_CPP_MIN_LOG_LEVEL=3 $(PY) examples/train_demo.py $(BUILD)/libdlb_example_kernels.so
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
	@echo; $(MAKE) --no-print-directory bench-scaling

# The free-threaded scaling rows (docs/bench.md "Free-threaded scaling"): 1
# thread against one per CPU, in .venv313t with the extension rebuilt there
# (scripts/python-suite 3.13t sets both up, the interpreter too, when
# missing; no tests run).
bench-scaling:
	@echo "== free-threaded scaling: 1 thread against N (dlbridge bench --scaling, 3.13t) =="
	@SETUP_ONLY=1 scripts/python-suite 3.13t
	@if [ -x .venv313t/bin/python ]; then \
	   .venv313t/bin/python -m dlbridge bench --scaling --plain \
	     --kernels build-py313t/libdlb_example_kernels.so; \
	 else echo "bench-scaling: not run: no free-threaded 3.13 (above)"; fi

clean:
	rm -rf $(BUILD) $(ASAN) build-py3* build-wheel $(PCBUILD) build-tsan
