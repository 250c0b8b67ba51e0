"""`llm-operator`: run the operator, or render what it would apply (for GitOps review and diffs)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from llm_operator.api.v1alpha1 import LLMDeployment
from llm_operator.bounded_yaml import InputError, display_name
from llm_operator.controller.config import OperatorConfig
from llm_operator.desired import desired, in_place_model, plan_for
from llm_operator.engine.state import BuildFact, BuildObserved, ModelFact, ModelObserved
from llm_operator.manifests import load_deployments, load_nodes, mask, secrets
from llm_operator.modelcache.keys import source_key
from llm_operator.plan.inventory import Inventory
from llm_operator.plan.types import PlanningError
from llm_operator.release_pin import deployment_images
from llm_operator.render.model_fetch import model_request
from llm_operator.storage import ModelLocation, cached_model

# A string another YAML parser may read as a number: kubectl's (YAML 1.1 in Go) reads `0578731095`,
# which PyYAML writes plain, as the integer 578731095, and refuses it as a label value.
_NUMBER_LIKE = re.compile(
    r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?|0[xX][0-9a-fA-F_]+|0[oObB][0-9_]+"
    r"|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)"
)


class _PlainDumper(yaml.SafeDumper):
    """Rendered objects are read by people and diffed in git: never emit YAML anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "'" if _NUMBER_LIKE.fullmatch(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_PlainDumper.add_representer(str, _string)


def dump_objects(objects: list[dict[str, Any]]) -> str:
    """Objects as `render` prints them: YAML documents that kubectl reads back unchanged."""
    return yaml.dump_all(objects, Dumper=_PlainDumper, sort_keys=False) if objects else ""


def load_inventory(path: str | None) -> Inventory | None:
    if path is None:
        return None
    inventory = Inventory()
    for node in load_nodes(path):
        inventory.upsert(node)
    return inventory


def _config() -> OperatorConfig:
    try:
        return OperatorConfig.from_env()
    except ValueError as e:
        raise InputError("environment", "LLMOP_* settings", str(e)) from None


@contextlib.contextmanager
def _refusals(source: str, where: str, document: Any) -> Iterator[None]:
    """A document the planner or builders refuse, as one line; anything else they raise too (its
    secrets masked), rather than a traceback in a CI log."""
    try:
        yield
    except InputError:
        raise
    except PlanningError as e:
        what = mask(e.message, secrets(document))
        raise InputError(source, where, f"cannot be placed ({e.reason}): {what}") from None
    except Exception as e:
        what = mask(str(e), secrets(document)) or type(e).__name__
        raise InputError(source, where, f"cannot be rendered: {what}") from None


# What `render` shows for a model the fetch has cached: its resolved revision is the fetch's to say.
RENDERED_MODEL = ModelObserved(ModelFact.RECORDED, resolved_revision="RESOLVED")
NOT_FETCHED = ModelObserved(ModelFact.ABSENT)


def _as_rendered(ld: LLMDeployment, model: ModelObserved) -> ModelObserved:
    if model.fact != ModelFact.RECORDED:
        return model
    source = ld.spec.model.source
    directory = f"models/{source_key(source.uri, source.endpoint)}/{model.resolved_revision}"
    return ModelObserved(ModelFact.RECORDED, directory=directory, resolved_revision=model.resolved_revision)


def _model_location(ld: LLMDeployment) -> ModelLocation | None:
    """The model's files in a serving pod as `render` shows them: a pvc:// source read in place,
    or the model cache's directory of the revision the fetch resolves."""
    request = model_request(ld.spec)
    if request is None:
        return in_place_model(ld.spec)
    return cached_model(request.claim, _as_rendered(ld, RENDERED_MODEL).directory)


def render(args: argparse.Namespace) -> int:
    """What the operator applies, from the same `desired` it calls: first the fetch and build Jobs
    it starts while the model and engines are missing, then everything it applies once they exist.
    Nothing is printed until every document has rendered."""
    config = _config()
    inventory = load_inventory(args.nodes)
    deployments, skipped = load_deployments(args.file, sys.stdin)
    source = display_name(args.file)
    out: list[dict[str, Any]] = []
    notes = [f"# {source}: no LLMDeployment ({skipped} other objects)"] if not deployments else []
    for d in deployments:
        with _refusals(source, d.where, d.obj.body):
            images = deployment_images(d.ld, config.images)  # the annotation's release, else the default
            plan = plan_for(d.ld, inventory, images)
            # The Jobs while nothing is fetched, then while nothing is built, then everything the
            # operator applies once both exist. A cached model's directory is named by the revision
            # the fetch resolves, unknown here.
            stages = ((NOT_FETCHED, BuildFact.ABSENT), (RENDERED_MODEL, BuildFact.ABSENT),
                      (RENDERED_MODEL, BuildFact.RECORDED))  # fmt: skip
            jobs: dict[tuple[str, str], dict[str, Any]] = {}
            for model, fact in stages:
                seen = _as_rendered(d.ld, model)
                want = desired(
                    d.ld,
                    plan,
                    images,
                    lambda *_, fact=fact: BuildObserved(fact),
                    leader_worker_set=args.leader_worker_set,
                    prometheus_url=config.prometheus_url,
                    metrics_peers=config.metrics_peers,
                    keda_namespace=config.keda_namespace,
                    models=lambda *_, seen=seen: seen,
                    fetch_max_bytes_per_second=config.fetch_max_bytes_per_second,
                )
                jobs |= {(j["kind"], j["metadata"]["name"]): j for j in want.jobs}
            out += [*jobs.values(), *want.shared, *want.children]
        notes.append(f"# {d.name}: {plan.reason}")
        notes += [f"# {d.name}: warning: {warning}" for warning in plan.warnings]
    print("\n".join(notes), file=sys.stderr)
    sys.stdout.write(dump_objects(out))
    return 0


def model_repo(args: argparse.Namespace) -> int:
    """Every file is rendered before the first is written."""
    from llm_operator.modelrepo import render_repository
    from llm_operator.runtime.preflight import image_file_paths
    from llm_operator.runtime.repository import write_repository
    from llm_operator.storage import engine_location, tokenizer_location

    inventory = load_inventory(args.nodes)
    deployments, _ = load_deployments(args.file, sys.stdin)
    source = display_name(args.file)
    repositories = []
    images = _config().images
    for d in deployments:
        with _refusals(source, d.where, d.obj.body):
            plan = plan_for(d.ld, inventory, images)
            engine_dir = args.engine_dir
            if engine_dir is None and d.ld.spec.engine.prebuilt is not None:
                engine_dir = engine_location(d.ld.spec.engine.prebuilt.uri, None).engine_dir
            engine_dir = engine_dir or "/engine-cache/engine"
            model = _model_location(d.ld)
            model_dir = model.model_dir if model else ""
            tokenizer = tokenizer_location(d.ld.spec.runtime.tokenizer_uri)
            # The same choice as storage.tokenizer_dir, with the engine directory given here.
            tokenizer_dir = tokenizer.tokenizer_dir if tokenizer else model_dir or f"{engine_dir}/tokenizer"
            for pool in plan.pools:
                files = render_repository(d.ld.spec, pool, engine_dir=engine_dir, tokenizer_dir=tokenizer_dir,
                                          model_dir=model_dir)  # fmt: skip
                dest = Path(args.output) / (pool.name if len(plan.pools) > 1 else "")
                repositories.append((d.name, pool.name, files, dest, d.ld.spec.engine.backend.value))
    for name, pool_name, files, dest, backend in repositories:
        try:
            write_repository(files, dest)
        except OSError as e:
            what = f"cannot be written ({e.strerror or type(e).__name__})"
            raise InputError(args.output, "output directory", what) from None
        print(f"wrote {len(files)} files for {name} pool {pool_name} to {dest}", file=sys.stderr)
        for path, where in image_file_paths(backend).items():
            # NVIDIA's code, which serving pods take from their image (runtime/preflight.py).
            print(f"  not written: {path}: copy it from {where} in the serving image", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    import kopf

    from llm_operator.controller import handlers
    from llm_operator.controller.cluster import leader
    from llm_operator.controller.cluster.namespaces import NamespaceScope
    from llm_operator.controller.http_server import serve_metrics

    level = logging.getLevelName(os.environ.get("LLMOP_LOG_LEVEL", "INFO"))
    logging.basicConfig(level=level)
    # One line per API request only when debugging.
    logging.getLogger("httpx2").setLevel(level if level <= logging.DEBUG else logging.WARNING)
    namespaces = tuple(dict.fromkeys(args.namespace or ()))
    # kopf watches named namespaces each; a pattern is one cluster-wide watch, filtered by the
    # handler as the children's are (controller/cluster/namespaces.py).
    kopf_namespaces = () if NamespaceScope(namespaces).patterned else namespaces
    try:
        config = handlers.Runtime.config = OperatorConfig.from_env(namespaces)
    except ValueError as e:
        raise InputError("environment", "LLMOP_* settings", str(e)) from None
    serve_metrics(config.metrics_port)  # a standby's too: it reports llm_operator_leader 0

    async def operator(term: leader.Term) -> None:
        handlers.Runtime.term = term
        await kopf.operator(
            standalone=True,  # no kopf peering: the Lease decides which replica runs at all
            clusterwide=not kopf_namespaces,
            namespaces=kopf_namespaces,
            stop_flag=term.stop,
        )

    return asyncio.run(leader.run(config.leader_election, config.health_port, operator))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llm-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the operator against the current kubeconfig / in-cluster config")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        help="watch this namespace (repeat for several), or those a kopf pattern matches ('!team-*': every"
        " namespace but team-*'s; needs cluster-wide permissions); default: all",
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
    try:
        result: int = args.func(args)
    except InputError as e:  # every command's one way out for bad input: one line, exit 1
        print(e, file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
