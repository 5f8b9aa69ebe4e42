"""The core's instructions per input, as callgrind counts them: repeatable to the instruction.

``PYTHONHASHSEED=0 valgrind --tool=callgrind python core_instructions.py MODE`` with MODE
``none`` (build the fleet and the inputs only), ``core`` (also apply them one at a time through
``bench_core``'s single-input pass) or ``tracker`` (the membership tracker the core's ratio is
measured against). The instructions of a pass are its run's total less the ``none`` run's,
divided by the inputs it printed. Run from this folder so ``bench_core`` imports; the package
is the one the interpreter imports, so another tree's venv measures that tree.
"""

from __future__ import annotations

import argparse
import gc

from bench_core import fleet, run_single, run_tracker, workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("none", "core", "tracker"))
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    inputs = workload(fleet(args.groups, args.workers, 0.10, args.seed), args.seed)
    gc.collect()
    gc.freeze()
    if args.mode == "core":
        applied = run_single(inputs, tally=False)[2]
    elif args.mode == "tracker":
        applied = run_tracker(inputs)[2]
    else:
        applied = len(inputs)
    print(f"inputs {applied}")


if __name__ == "__main__":
    main()
