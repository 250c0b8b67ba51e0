"""`llm-operator`: run the operator, or render what it would apply (for GitOps review and diffs)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.plan.types import PlanningError


class _PlainDumper(yaml.SafeDumper):
    """Rendered objects are read by people and diffed in git: never emit YAML anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def load_manifests(path: str) -> list[LLMDeployment]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    docs = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "LLMDeployment"]
    if not docs:
        raise SystemExit(f"{path}: no LLMDeployment found")
    result = []
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("namespace", "default")
        doc["metadata"].setdefault("uid", "")
        try:
            result.append(LLMDeployment.model_validate(doc))
        except ValidationError as e:
            name = doc["metadata"].get("name", "?")
            raise SystemExit(f"{path}: LLMDeployment {name} is invalid:\n{e}") from None
    return result


def load_inventory(path: str | None) -> Any:
    if path is None:
        return None
    from llm_operator.plan.inventory import Inventory

    data = yaml.safe_load(Path(path).read_text())
    nodes = data.get("items", [data]) if isinstance(data, dict) else data
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and n.get("kind") == "Node" for n in nodes):
        raise SystemExit(f"{path}: not a list of Node objects (expected `kubectl get nodes -o yaml`)")
    inventory = Inventory()
    for node in nodes:
        inventory.upsert(node)
    return inventory


def render(args: argparse.Namespace) -> int:
    """What the operator applies, from the same `desired` it calls: first the build Jobs it starts
    while engines are missing, then everything it applies once they exist."""
    from llm_operator.controller.config import OperatorConfig
    from llm_operator.desired import desired, plan_for
    from llm_operator.engine.state import BuildFact, BuildObserved

    config = OperatorConfig.from_env()
    inventory = load_inventory(args.nodes)
    out: list[dict[str, Any]] = []
    for ld in load_manifests(args.file):
        try:
            plan = plan_for(ld, inventory)
            for fact in (BuildFact.ABSENT, BuildFact.RECORDED):
                want = desired(
                    ld,
                    plan,
                    config.images,
                    lambda *_, fact=fact: BuildObserved(fact),
                    leader_worker_set=args.leader_worker_set,
                    prometheus_url=config.prometheus_url,
                )
                out += want.jobs if fact == BuildFact.ABSENT else want.shared + want.children
        except PlanningError as e:
            print(f"# {ld.name}: cannot be placed ({e.reason}): {e.message}", file=sys.stderr)
            return 1
        print(f"# {ld.name}: {plan.reason}", file=sys.stderr)
        for warning in plan.warnings:
            print(f"# {ld.name}: warning: {warning}", file=sys.stderr)
    sys.stdout.write(yaml.dump_all(out, Dumper=_PlainDumper, sort_keys=False))
    return 0


def model_repo(args: argparse.Namespace) -> int:
    from llm_operator.desired import plan_for
    from llm_operator.modelrepo import render_repository
    from llm_operator.runtime.repository import write_repository
    from llm_operator.storage import engine_location

    inventory = load_inventory(args.nodes)
    for ld in load_manifests(args.file):
        plan = plan_for(ld, inventory)
        for pool in plan.pools:
            engine_dir = args.engine_dir
            if engine_dir is None and ld.spec.engine.prebuilt is not None:
                engine_dir = engine_location(ld.spec.engine.prebuilt.uri, None).engine_dir
            engine_dir = engine_dir or "/engine-cache/engine"
            files = render_repository(
                ld.spec, pool, engine_dir=engine_dir, tokenizer_dir=f"{engine_dir}/tokenizer"
            )
            dest = Path(args.output) / (pool.name if len(plan.pools) > 1 else "")
            write_repository(files, dest)
            print(f"wrote {len(files)} files for {ld.name} pool {pool.name} to {dest}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    import kopf

    from llm_operator.controller import handlers, leader
    from llm_operator.controller.config import OperatorConfig
    from llm_operator.controller.http_server import serve_metrics

    level = logging.getLevelName(os.environ.get("LLMOP_LOG_LEVEL", "INFO"))
    logging.basicConfig(level=level)
    # One line per API request only when debugging.
    logging.getLogger("httpx2").setLevel(level if level <= logging.DEBUG else logging.WARNING)
    namespaces = tuple(dict.fromkeys(args.namespace or ()))
    config = handlers.Runtime.config = OperatorConfig.from_env(namespaces)
    serve_metrics(config.metrics_port)  # a standby's too: it reports llm_operator_leader 0

    async def operator(term: leader.Term) -> None:
        handlers.Runtime.term = term
        await kopf.operator(
            standalone=True,  # no kopf peering: the Lease decides which replica runs at all
            clusterwide=not namespaces,
            namespaces=namespaces,
            stop_flag=term.stop,
        )

    return asyncio.run(leader.run(config.leader_election, config.health_port, operator))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the operator against the current kubeconfig / in-cluster config")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", action="append", help="watch this namespace (repeat for several); default: all"
    )
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace (default)")
    p.set_defaults(func=run)
    p = sub.add_parser("render", help="print every child object the operator would apply, as YAML")
    p.add_argument("-f", "--file", required=True, help="LLMDeployment manifest ('-' for stdin)")
    p.add_argument("--nodes", help="node inventory to plan against (kubectl get nodes -o yaml)")
    p.add_argument(
        "--leader-worker-set",
        action="store_true",
        help="multi-node replicas as LeaderWorkerSets, as the operator does where that CRD is installed",
    )
    p.set_defaults(func=render)
    p = sub.add_parser("model-repo", help="write the rendered Triton model repository to a directory")
    p.add_argument("-f", "--file", required=True)
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--nodes")
    p.add_argument("--engine-dir", help="engine directory the repository points at")
    p.set_defaults(func=model_repo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
