"""The default table against one ISA's table forced, by loop family.

On a CPU that a row of csrc/dispatch.c names (cfbn.runtime_info()'s
``cpu_row``), the default runs some families on another ISA than
``selected_isa``; this times each family's cells (benchmarks/isa_classes.py's)
under the default and under ``--against`` (default: selected_isa) forced,
interleaved in one process, and prints default / forced time: below 1 where
the row's choice pays.  A family that runs the same table either way shows
the noise floor.

    python benchmarks/family_rows.py [--against avx2] [--threads 2] [--rounds 5]
"""
import argparse
import math
import sys

import cfbn
from cfbn import _kernels
import isa_classes
from _bench_common import median_ratio


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default=cfbn.runtime_info()["selected_isa"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    info = cfbn.runtime_info()
    print("cpu row %s; family ISAs %s" % (info["cpu_row"], info["family_isas"]))
    previous = _kernels.selection()

    def default(call):
        def run():
            _kernels.select_default()
            call()
        return run

    def forced(call):
        def run():
            _kernels.select_isa(args.against)
            call()
        return run

    try:
        for family in isa_classes.FAMILIES:
            got = [r for r, _ in isa_classes.family_ratios(
                family, lambda c: median_ratio(default(c), forced(c), args.rounds,
                                               isa_classes.MIN_BATCH_S),
                isa_classes.SHAPES[::2], args.threads)]
            print("%-15s default / %s: geometric mean %.3f, worst %.3f, %d cells" % (
                family, args.against, math.exp(sum(map(math.log, got)) / len(got)), max(got),
                len(got)))
            sys.stdout.flush()
    finally:
        _kernels.restore_selection(previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
