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

.PHONY: all bootstrap build test test-c test-valgrind test-python sanitize \
        demo bench clean

all: build

bootstrap:
	@scripts/bootstrap

build: bootstrap
	@$(PY) -m pip install -q --no-build-isolation --no-deps \
	    -Cbuild-dir=$(BUILD) . 2>&1 | grep -v '^$$' || true
	@$(PY) -c 'import dlbridge' || { echo "build failed: see above"; exit 1; }

test: build test-c test-valgrind sanitize test-python

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

test-python: build
	@PYTHONPATH=$(TESTPATH) $(PYTEST) -q tests/python

demo: build
	@echo "== libdlbridge from C (examples/demo_c.c) =="
	@$(BUILD)/demo_c
	@echo
	@echo "== through Python: NumPy and torch via dlbridge and back (examples/demo.py) =="
	@$(PY) examples/demo.py

bench: build
	@$(BUILD)/bench_copy

clean:
	rm -rf $(BUILD) $(ASAN)
