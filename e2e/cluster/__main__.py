"""`python -m e2e.cluster up [--with ADDON...] [--session PID]|down|release --session PID|status|
import-image [ARCHIVE...] [--state-dir DIR]`: exit 0 on success, 1 with one line on error. `up`
starts the core (control plane, registry, real node); `--with` adds add-ons (addons.py; `all`: every
one), to a running cluster too. With `--session`, `up` takes a test session's lease for PID instead
of pinning the cluster, and `release` drops it (stopping a cluster no one else holds), as the tests'
own sessions do: scripts/test.sh holds one across its several pytest runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2e.cluster import addons, gateway, registry
from e2e.cluster.components import CONTROL_PLANE
from e2e.cluster.launcher import Cluster, UpReport
from e2e.cluster.monitoring import PROMETHEUS_URL
from e2e.cluster.node import NODE_COMPONENTS
from e2e.cluster.readiness import ClusterError
from e2e.cluster.state import DEFAULT_STATE_DIR


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


def _print_up(cluster: Cluster, report: UpReport) -> None:
    if report.builds:
        per = ", ".join(f"{tool} {seconds} s" for tool, seconds in report.builds.items())
        print(f"cold build (binaries not cached): {per}; build-tools.sh {report.build_seconds:.0f} s in all")
    state = "already running, healthy" if report.already_running else "started"
    if report.added:
        state += f"; added {', '.join(report.added)}"
    print(
        f"cluster {state} in {report.seconds:.1f} s (apiserver https://127.0.0.1:{report.ports.get('kube-apiserver')})"
    )
    groups = [("control plane", CONTROL_PLANE), ("real node", NODE_COMPONENTS)]
    for name, what in (("enforcer", "policy enforcer"), ("monitoring", "monitoring"), ("gateway", "gateway")):
        if name in report.addons:
            groups.append((what, addons.ADDONS[name].components))
    for what, names in groups:
        per = ", ".join(f"{c} {_mib(report.rss_kib.get(c, 0))}" for c in names)
        print(f"{what} RSS {_mib(sum(report.rss_kib.get(c, 0) for c in names))}: {per}")
    if "monitoring" in report.addons:
        print(
            f"prometheus: http://127.0.0.1:{report.ports.get('prometheus')} (in-cluster {PROMETHEUS_URL}); "
            "custom metrics: kubectl get --raw /apis/custom.metrics.k8s.io/v1beta2"
        )
    if "gateway" in report.addons:
        print(
            f"gateway {gateway.NAMESPACE}/{gateway.GATEWAY} (listener {gateway.LISTENER}): "
            f"http://127.0.0.1:{report.ports.get('gateway')} (in-cluster {gateway.URL})"
        )
    print(
        f"registry: https://{registry.HOST} inside the namespace (user {registry.PUSH_USER}, CA "
        f"{cluster.state_dir / 'pki' / 'ca.crt'}); `make images` pushes there; "
        f"{', '.join(registry.MIRRORED)} names mirror to it on the node"
    )
    absent = [name for name in addons.ALL if name not in report.addons]
    if absent:
        print(f"add-ons not started: {', '.join(absent)} (python -m e2e.cluster up --with NAME, or all)")
    print(f"kubeconfig: export KUBECONFIG={cluster.kubeconfig}  (or: source {cluster.state_dir / 'env'})")
    print(f"shell inside the cluster's network namespace: nsenter --net=/run/netns/{cluster.netns} bash")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "release", "status", "import-image"))
    parser.add_argument("archives", nargs="*", type=Path, help="import-image: OCI archives (.oci.tar)")
    parser.add_argument(
        "--with",
        dest="addons",
        nargs="+",
        default=[],
        choices=(*addons.ALL, "all"),
        metavar="ADDON",
        help=f"up: add-ons to start as well: {', '.join(addons.ALL)}, or all",
    )
    parser.add_argument("--session", type=int, help="up, release: a test session's pid (its lease)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default: %(default)s")
    args = parser.parse_args(argv)
    cluster = Cluster(args.state_dir)
    try:
        if args.command == "up":
            wanted = addons.ALL if "all" in args.addons else args.addons
            _print_up(cluster, cluster.up(session=args.session, addons=wanted))
        elif args.command == "release":
            if args.session is None:
                parser.error("release needs --session PID")
            print(
                "cluster stopped" if cluster.release(args.session) else "lease dropped; the cluster stays up"
            )
        elif args.command == "import-image":
            for archive in args.archives:
                print(f"{archive}: {', '.join(cluster.import_image(archive))}")
        elif args.command == "down":
            stopped = cluster.down()
            print(f"cluster stopped ({', '.join(stopped)})" if stopped else "cluster was not running")
        else:
            status = cluster.status()
            for name, c in status["components"].items():
                state = f"running pid {c['pid']}, RSS {_mib(c['rss_kib'])}" if c["running"] else "not running"
                print(f"{name}: {state}")
            ready = "ready" if status["apiserver_ready"] else "not ready"
            print(f"apiserver {ready}; nodes Ready: {status['nodes_ready']}/{status.get('nodes_total', 0)}")
            return 0 if status["apiserver_ready"] else 1
    except ClusterError as e:
        print(f"cluster {args.command} failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"cluster {args.command} interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
