#!/usr/bin/env python3
"""check_symbols.py LIBDLBRIDGE HEADER [EXTENSION]

The export lists, read with `nm -D --defined-only`:
  - libdlbridge.so exports exactly the functions dlbridge.h declares with
    DLB_API: no dlb__* internal, nothing else, none missing;
  - the Python extension (when given) exports only PyInit__core: it links
    the core statically and must not re-export it.
Exit status 0 when all hold, 1 with one line per problem otherwise.
"""
import re
import subprocess
import sys


def exported(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        # "address type name"; keep functions and data, not the markers the
        # linker adds (versions, _init/_fini, the bss and edata bounds).
        if len(parts) == 3 and parts[1] in "TDBRtdbrVWvwi":
            names.add(parts[2].split("@")[0])
    return names


def declared(header):
    text = open(header, encoding="utf-8").read()
    return set(re.findall(r"^DLB_API\b[^;(]*?\b(dlb_\w+)\s*\(", text, re.M))


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    problems = []
    lib = exported(argv[1])
    public = declared(argv[2])
    if len(public) < 50:
        problems.append(f"only {len(public)} DLB_API declarations found in "
                        f"{argv[2]}: is the parser out of date?")
    ours = {n for n in lib if n.startswith("dlb")}
    for n in sorted(n for n in ours if n.startswith("dlb__")):
        problems.append(f"{argv[1]} exports the internal symbol {n}")
    for n in sorted(ours - public - {n for n in ours if n.startswith("dlb__")}):
        problems.append(f"{argv[1]} exports {n}, which dlbridge.h does not "
                        "declare with DLB_API")
    for n in sorted(public - lib):
        problems.append(f"{argv[1]} does not export the public {n}")
    for n in sorted(lib - ours):
        if not n.startswith("_"):
            problems.append(f"{argv[1]} exports the foreign symbol {n}")
    if len(argv) == 4:
        ext = exported(argv[3])
        for n in sorted(ext - {"PyInit__core"}):
            if not n.startswith("_"):
                problems.append(f"{argv[3]} exports {n}; only PyInit__core "
                                "should be visible")
    for p in problems:
        print(p)
    if not problems:
        print(f"symbols: {len(lib & public)} public functions exported, no "
              "internals")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
