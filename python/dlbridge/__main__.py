"""`python -m dlbridge`: report the version and which frameworks are present."""

import argparse
import importlib.util
import sys

FRAMEWORKS = ("numpy", "torch", "cupy", "jax", "tensorflow", "pyarrow", "paddle")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dlbridge", description=__doc__)
    parser.add_argument("command", nargs="?", default="info", choices=["info"],
                        help="what to do (default: info)")
    parser.parse_args(argv)
    import dlbridge

    print(f"dlbridge {dlbridge.__version__} (DLPack "
          f"{dlbridge.DLPACK_MAJOR_VERSION}.{dlbridge.DLPACK_MINOR_VERSION}, "
          f"Python {sys.version.split()[0]})")
    for name in FRAMEWORKS:
        found = importlib.util.find_spec(name) is not None
        print(f"  {name:<11} {'installed' if found else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
