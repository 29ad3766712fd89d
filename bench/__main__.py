"""Run the benchmarks named on the command line (all of them when none is named).

Each ``bench/bench_<name>.py`` exposes ``main(argv) -> str`` returning its table(s).
"""

import importlib
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    available = sorted(
        m.name.removeprefix("bench_")
        for m in pkgutil.iter_modules(bench.__path__)
        if m.name.startswith("bench_")
    )
    names = [a for a in argv if not a.startswith("-")] or available
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    for name in names:
        module = importlib.import_module(f"bench.bench_{name}")
        print(module.main([a for a in argv if a.startswith("-")]), flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
