"""Run a Python program with xseg as its CUDA allocator, the program unchanged:

    python3 -m xseg [--conf XSEG_CONF] [--log LEVEL] script.py [args...]
    python3 -m xseg [--conf XSEG_CONF] [--log LEVEL] -m module [args...]

xseg.install() runs first, before the program can touch CUDA; then the
program runs as __main__ with its own arguments, as `python3 script.py
args` or `python3 -m module args` would run it (sys.argv, sys.path[0] and
its exit status are the program's). Processes the program starts with the
spawn method run PyTorch's own allocator unless they install xseg
themselves; CUDA tensors they receive through torch.multiprocessing still
arrive by xseg's sharing."""
import argparse
import os
import runpy
import sys
from typing import List, Optional

_LEVELS = ("error", "warn", "info", "debug")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m xseg", allow_abbrev=False,
        description="Run a Python program with xseg installed as PyTorch's CUDA allocator.",
        epilog="Everything after the script (or -m module) goes to the program.")
    p.add_argument("--conf", metavar="XSEG_CONF",
                   help="allocator configuration, key:value,... (applied over the XSEG_CONF variable)")
    p.add_argument("--log", metavar="LEVEL", choices=_LEVELS, help="log xseg's messages to standard error at LEVEL")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run MODULE as a script, as python3 -m does")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="script.py [args...]")
    return p


def main(argv: Optional[List[str]] = None) -> None:
    p = _parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    rest = list(args.program)
    if args.module is None and not rest:
        p.error("a script or -m MODULE is needed")
    if args.module is None and not os.path.isfile(rest[0]):
        p.error(f"no such script: {rest[0]}")
    from . import install
    try:
        install(conf=args.conf, enable_logging=args.log or False)
    except ImportError as e:
        sys.exit(f"xseg: PyTorch is needed to install xseg as its allocator: {e}")
    except (RuntimeError, ValueError, OSError) as e:
        sys.exit(f"xseg: {e}")
    if args.module is not None:
        sys.argv = [args.module] + rest
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
