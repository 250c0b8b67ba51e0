"""`make bench`: planner and operator benchmarks; figures and side-by-side ratios are printed.

Options: --deployments N (default 200; 500 for the RSS goal), --idle-seconds S (default 120),
--only planner|operator|autoscaling.
"""

from __future__ import annotations

import argparse

from bench import autoscaling, operator, planner


def main() -> None:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--deployments", type=int, default=None)
    parser.add_argument("--idle-seconds", type=int, default=None)
    parser.add_argument("--only", choices=["planner", "operator", "autoscaling"])
    args = parser.parse_args()
    if args.only in (None, "planner"):
        planner.run(print)
    if args.only in (None, "operator"):
        operator.run(print, n=args.deployments, idle_seconds=args.idle_seconds)
    if args.only in (None, "autoscaling"):
        autoscaling.run(print)


if __name__ == "__main__":
    main()
