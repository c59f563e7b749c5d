#!/usr/bin/env bash
# build_peers.sh -- build the extensions bench/bench_calls.py measures against,
# into build/bench/:
#   _noop        bare METH_FASTCALL no-op + raw exchange-API loop (cc, C11)
#   _nb_peer     nanobind 3.1 from its shipped sources (g++, C++17)
#   libtvm_peer  a tvm-ffi module compiled against tvm_ffi's shipped headers
#                and libtvm_ffi.so, loaded with tvm_ffi.load_module
#   libjax_tvm_peer  the no-op kernel of build/libdlb_example_kernels.so, and
#                its mul_f32 kernel and that kernel's vjp, and its batch
#                kernel bscale, as tvm-ffi functions registered with
#                jax-tvm-ffi as XLA FFI targets (bench/bench_compiled.py,
#                `dlbridge bench`'s jax compiled, train-jit and vmap-jit
#                rows); needs jax-tvm-ffi and `make build` first
# Idempotent: each output is rebuilt only when one of its inputs is newer.
# A peer whose package or compiler is missing, or that fails to compile, is
# skipped with a note (bench_calls.py then reports it as not measured); the
# no-op floor must always build.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=build/bench
mkdir -p "$OUT"
CC=${CC:-cc}
CXX=${CXX:-g++}

say() { printf 'build_peers: %s\n' "$*" >&2; }

# stale OUTPUT INPUT...: true when OUTPUT is missing or older than an input.
stale() {
  local out=$1; shift
  [ -f "$out" ] || return 0
  local f
  for f in "$@"; do [ "$f" -nt "$out" ] && return 0; done
  return 1
}

PYINC=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
EXT=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

# ---- the floor (required) -------------------------------------------------------
if stale "$OUT/_noop$EXT" bench/_noop.c include/dlpack/dlpack.h; then
  say "building _noop"
  $CC -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror \
      -Iinclude -I"$PYINC" bench/_noop.c -o "$OUT/_noop$EXT"
fi

# The peers are built in functions run under `||`, where set -e is off, so
# every step says `|| return 1` itself.

# ---- nanobind -------------------------------------------------------------------
build_nanobind() {
  local nb
  if ! nb=$($PY -c 'import nanobind, os; print(os.path.dirname(nanobind.__file__))' 2>/dev/null); then
    say "nanobind not installed: nanobind peer skipped"
    return 0
  fi
  local flags=(-std=c++17 -O2 -DNDEBUG -fPIC -fvisibility=hidden
               -I"$nb/include" -I"$nb/ext/robin_map/include" -I"$PYINC")
  # nanobind's runtime is compiled once into an object; the peer is relinked
  # against it when only the peer changes.
  if stale "$OUT/nb_combined.o" "$nb/src/nb_combined.cpp"; then
    say "compiling nanobind runtime (nb_combined.cpp)"
    $CXX "${flags[@]}" -c "$nb/src/nb_combined.cpp" -o "$OUT/nb_combined.o" || return 1
  fi
  if stale "$OUT/_nb_peer$EXT" bench/_nb_peer.cpp "$OUT/nb_combined.o"; then
    say "building _nb_peer"
    $CXX "${flags[@]}" -shared bench/_nb_peer.cpp "$OUT/nb_combined.o" \
        -o "$OUT/_nb_peer$EXT" || return 1
  fi
}

# ---- tvm-ffi --------------------------------------------------------------------
build_tvm() {
  local inc dlinc lib
  if ! { inc=$($PY -c 'import tvm_ffi.libinfo as l; print(l.find_include_path())' 2>/dev/null) &&
         dlinc=$($PY -c 'import tvm_ffi.libinfo as l; print(l.find_dlpack_include_path())' 2>/dev/null) &&
         lib=$($PY -c 'import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())' 2>/dev/null); }; then
    say "apache-tvm-ffi not installed: tvm-ffi peer skipped"
    return 0
  fi
  if stale "$OUT/libtvm_peer.so" bench/_tvm_peer.cc "$lib"; then
    say "building libtvm_peer.so"
    # rpath to the wheel's own libtvm_ffi.so, the copy `import tvm_ffi`
    # loads, so the process has one function registry.
    $CXX -std=c++17 -O2 -DNDEBUG -fPIC -shared -I"$inc" -I"$dlinc" \
        bench/_tvm_peer.cc -L"$(dirname "$lib")" -ltvm_ffi \
        -Wl,-rpath,"$(dirname "$lib")" -o "$OUT/libtvm_peer.so" || return 1
  fi
}

# ---- jax-tvm-ffi ----------------------------------------------------------------
build_jax_tvm() {
  local inc dlinc lib kernels=$PWD/build/libdlb_example_kernels.so
  if ! $PY -c 'import importlib.util as u, sys; sys.exit(u.find_spec("jax_tvm_ffi") is None)' 2>/dev/null ||
     ! { inc=$($PY -c 'import tvm_ffi.libinfo as l; print(l.find_include_path())' 2>/dev/null) &&
         dlinc=$($PY -c 'import tvm_ffi.libinfo as l; print(l.find_dlpack_include_path())' 2>/dev/null) &&
         lib=$($PY -c 'import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())' 2>/dev/null); }; then
    say "jax-tvm-ffi or apache-tvm-ffi not installed: jax-tvm-ffi peer skipped"
    return 0
  fi
  if [ ! -f "$kernels" ]; then
    say "$kernels not built (make build): jax-tvm-ffi peer skipped"
    return 0
  fi
  if stale "$OUT/libjax_tvm_peer.so" bench/_jax_tvm_peer.cc "$kernels" "$lib"; then
    say "building libjax_tvm_peer.so"
    # The kernel library by its absolute path (it has no soname), so the
    # peer finds it wherever it is loaded from.
    $CXX -std=c++17 -O2 -DNDEBUG -fPIC -shared -I"$inc" -I"$dlinc" \
        bench/_jax_tvm_peer.cc "$kernels" -L"$(dirname "$lib")" -ltvm_ffi \
        -Wl,-rpath,"$(dirname "$lib")" -o "$OUT/libjax_tvm_peer.so" || return 1
  fi
}

if command -v "$CXX" >/dev/null 2>&1; then
  build_nanobind || { rm -f "$OUT/_nb_peer$EXT"; say "nanobind peer failed to build: skipped"; }
  build_tvm || { rm -f "$OUT/libtvm_peer.so"; say "tvm-ffi peer failed to build: skipped"; }
  build_jax_tvm || { rm -f "$OUT/libjax_tvm_peer.so"; say "jax-tvm-ffi peer failed to build: skipped"; }
else
  say "no C++ compiler ($CXX; apt-get install g++): nanobind, tvm-ffi and jax-tvm-ffi peers skipped"
fi
