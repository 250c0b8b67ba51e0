"""`make bench`: planner and operator benchmarks; figures and side-by-side ratios are printed.

Options: --sizes 100,500,1000,2000 (the operator's load curve; P4 is measured at 1000), --idle-seconds
S (default 120, per size), --edits-at N (default 1000), --only
planner|operator|autoscaling|canary|frontdoor|routing|cpu-models|waker|zero (P15 and P16, scale to
zero: bench/zero.py)|groups (P14, a multi-node group's recovery from a member's fault: bench/groups.py).
"""

from __future__ import annotations

import argparse

from bench import autoscaling, canary, cpu_models, frontdoor, groups, operator, planner, routing, waker, zero


def main() -> None:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--sizes", type=lambda v: [int(n) for n in v.split(",")], default=None)
    parser.add_argument("--idle-seconds", type=int, default=None)
    parser.add_argument("--edits-at", type=int, default=1000, help="the size at which P4 is measured")
    parser.add_argument(
        "--only",
        choices=[
            "planner",
            "operator",
            "autoscaling",
            "canary",
            "frontdoor",
            "routing",
            "cpu-models",
            "waker",
            "zero",
            "groups",
        ],
    )
    args = parser.parse_args()
    if args.only in (None, "planner"):
        planner.run(print)
    if args.only in (None, "operator"):
        operator.run(print, sizes=args.sizes, idle_seconds=args.idle_seconds, edits_at=args.edits_at)
    if args.only in (None, "autoscaling"):
        autoscaling.run(print)
    if args.only in (None, "canary"):
        canary.run(print)
    if args.only in (None, "frontdoor"):
        frontdoor.run(print)
    if args.only in (None, "routing"):
        routing.run(print)
    if args.only in (None, "cpu-models"):
        cpu_models.run(print)
    if args.only in (None, "waker"):
        waker.run(print)
    if args.only in (None, "zero"):
        zero.run(print)
    if args.only in (None, "groups"):
        groups.run(print)


if __name__ == "__main__":
    main()
