"""`dlbridge` / `python -m dlbridge`: info, doctor and bench.

  dlbridge              version and the frameworks present
  dlbridge doctor       every installed framework against every other
  dlbridge bench        per-call costs against each framework's own path

Exit status of doctor and bench: 0 when no dlbridge defect was found, 1
when one was, 2 for a usage error (found before anything runs).
"""

import argparse
import importlib.util
import json
import os
import sys

# The frameworks dlbridge knows: the registry's names (importing
# _frameworks imports dlbridge._core, which imports no framework).
def _known():
    from ._frameworks import REGISTRY
    return [n for n in REGISTRY if n != "dlbridge"]


def _info():
    import dlbridge

    print(f"dlbridge {dlbridge.__version__} (DLPack "
          f"{dlbridge.DLPACK_MAJOR_VERSION}.{dlbridge.DLPACK_MINOR_VERSION}, "
          f"Python {sys.version.split()[0]})")
    for name in _known():
        found = importlib.util.find_spec(name) is not None
        print(f"  {name:<11} {'installed' if found else '-'}")
    return 0


def _console(plain):
    """A rich Console, or None when rich is missing or plain text is asked."""
    if plain or importlib.util.find_spec("rich") is None:
        return None
    from rich.console import Console
    return Console(width=100, stderr=False)


# ------------------------------------------------------------- usage checks
# Every usage error is found before anything is probed or measured: exit
# status 2 with the reason (argparse's own errors too).

def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be above 0 and finite, not {text}")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in errors
    return parse


def _unwritable(path):
    """Why ``path`` cannot be written, or None.  The file is opened for
    appending (nothing written); one that did not exist is removed again."""
    if os.path.isdir(path):
        return f"{path} is a directory"
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return f"cannot write {path}: {e.strerror}"
    if not existed:
        os.unlink(path)
    return None


def _outputs(parser, **paths):
    for option, path in paths.items():
        if path and path != "-":
            why = _unwritable(path)
            if why:
                parser.error(f"--{option}: {why}")


def _framework_list(parser, text, known, installed):
    """The names of ``--frameworks`` (None: all installed), each known and
    installed, else a usage error."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        parser.error("--frameworks: no framework named")
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--frameworks: unknown framework(s) {', '.join(unknown)}; "
                     f"known: {', '.join(known)}")
    missing = [n for n in names if n not in installed]
    if missing:
        parser.error(f"--frameworks: not installed here: {', '.join(missing)}")
    return names


# ------------------------------------------------------------------ doctor

def _doctor(parser, args):
    from . import _doctor, _render
    from ._kits import kits

    table = kits()
    known = [n for n, k in table.items() if k.cpu]
    known += [n + _doctor.CUDA_SUFFIX for n, k in table.items() if k.cuda]
    fws = _framework_list(parser, args.frameworks, known,
                          _doctor.installed_frameworks())
    _outputs(parser, json=args.json, html=args.html)
    if args.rejudge:
        report = _saved_report(parser, args.rejudge, _doctor)
    else:
        report = _probe(args, fws, _doctor)
    if args.json:
        text = json.dumps(report, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(_render.html_page(report))
    if args.json != "-":
        console = _console(args.plain)
        vers = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
        if console is not None:
            console.print(f"[bold]dlbridge doctor[/] [dim]{vers}[/]")
            _render.rich_grid(report, console)
        else:
            print(f"dlbridge doctor: {vers}")
            print(_render.plain(report))
        print()
        print(_render.failure_text(report))
        print(f"\n{len(report['cells'])} probes in {report.get('seconds', '?')} s")
        if args.html:
            print(f"HTML report: {args.html}")
    gaps = report["defects"]
    for d in gaps[:20]:
        print(f"DLBRIDGE GAP: {d['producer']} → {d['consumer']} [{d['path']}] "
              f"{d['dtype']}/{d['layout']}: {d['outcome']}: {d['reason']}",
              file=sys.stderr)
    if len(gaps) > 20:
        print(f"… {len(gaps) - 20} more dlbridge gaps (--json lists them all)",
              file=sys.stderr)
    return 1 if gaps else 0


def _saved_report(parser, path, doctor):
    """A saved --json report, judged again with this dlbridge's kits."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        if report.get("schema_version") != doctor.SCHEMA_VERSION:
            raise ValueError(f"schema_version {report.get('schema_version')!r}, "
                             f"not {doctor.SCHEMA_VERSION}")
        return doctor.judge(report)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        parser.error(f"--rejudge: {path}: {e}")


def _probe(args, fws, doctor):
    if fws and "dlbridge" not in fws:
        fws.append("dlbridge")
    console = None if args.json == "-" else _console(args.plain)
    fws = fws or doctor.installed_frameworks()
    npairs = len(doctor.pairs_of(fws))
    run = dict(workers=args.jobs, timeout=args.timeout)
    if console is not None:
        from rich.progress import Progress
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("probing pairs", total=npairs)
            return doctor.run(fws, progress=lambda pair: bar.update(
                task, advance=1, description=f"{pair[0]} → {pair[1]}"), **run)
    done = [0]

    def step(pair):
        done[0] += 1
        if args.json != "-":
            print(f"\r[{done[0]}/{npairs}] {pair[0]} → {pair[1]}".ljust(50),
                  end="", file=sys.stderr, flush=True)
    report = doctor.run(fws, progress=step, **run)
    if args.json != "-":
        print(file=sys.stderr)
    return report


# ------------------------------------------------------------------- bench

def _bench(parser, args):
    from . import _bench

    args.frameworks = _framework_list(parser, args.frameworks, _bench.FRAMEWORKS,
                                      _bench.installed_frameworks())
    _outputs(parser, json=args.json, plot=args.plot)
    return _bench.main(args)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dlbridge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="version and frameworks present (default)")
    d = sub.add_parser("doctor", help="probe every framework pair")
    d.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': stdout only)")
    d.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    d.add_argument("--frameworks", metavar="A,B", help="only these (default: all installed)")
    d.add_argument("-j", "--jobs", type=_positive(int), default=2,
                   help="child processes at once (default 2)")
    d.add_argument("--timeout", metavar="S", type=_positive(float),
                   default=300.0,
                   help="seconds one probe may take (the child's imports "
                        "included) before it is killed as hung (default 300)")
    d.add_argument("--plain", action="store_true", help="plain text even when rich is installed")
    d.add_argument("--rejudge", metavar="FILE",
                   help="judge and show a saved --json report instead of probing")
    b = sub.add_parser("bench", help="per-call costs")
    b.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="write the results as JSON (no FILE or '-': stdout only)")
    b.add_argument("--plot", metavar="PNG", help="bar chart (needs matplotlib)")
    speed = b.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="fewer, shorter runs (seconds)")
    speed.add_argument("--full", action="store_true", help="more repetitions (slower, steadier)")
    b.add_argument("--frameworks", metavar="A,B", help="only these (default: all installed)")
    b.add_argument("--kernels", metavar="SO",
                   help="libdlb_example_kernels.so for the Function rows "
                        "(default: $DLB_EXAMPLE_KERNELS, then build/)")
    b.add_argument("--peers", metavar="DIR",
                   help="nanobind/tvm-ffi peers built by bench/build_peers.sh "
                        "(default: $DLBRIDGE_BENCH_PEERS, then build/bench)")
    b.add_argument("--plain", action="store_true", help="plain text even when rich is installed")
    scale = b.add_mutually_exclusive_group()
    scale.add_argument("--scaling", action="store_true",
                       help="only the free-threaded scaling rows (1 thread "
                            "against one per CPU; docs/bench.md)")
    scale.add_argument("--no-scaling", action="store_true",
                       help="leave the scaling rows out")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor(d, args)
    if args.command == "bench":
        return _bench(b, args)
    return _info()


if __name__ == "__main__":
    sys.exit(main())
