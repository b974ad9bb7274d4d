"""The ``fgplugin`` command (also ``python -m fgplugin``).

    fgplugin bench SUITE [options]     # benchmark suites; `fgplugin bench --help`
"""
from __future__ import annotations

import sys

COMMANDS = {"bench": "run a benchmark suite (epoch, accuracy, reorder, host, spmm, threshold, scaling)"}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fgplugin COMMAND [options]\n\ncommands:\n"
              + "\n".join(f"  {name:<8}{what}" for name, what in COMMANDS.items()))
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from .bench.cli import main as bench_main
        return bench_main(rest)
    print(f"fgplugin: unknown command {command!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
