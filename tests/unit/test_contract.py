"""The serving-pod contract end to end: pods rendered by the workload builders, their environment
read by the launcher's own parser, for every shape the builders emit. A variable the launcher does
not know, or a port, path or address it would get wrong, fails here rather than in a cluster."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from llm_operator import contract
from llm_operator.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llm_operator.controller.secrets.launch import launch_secret
from llm_operator.engine import build, build_job, cache_key
from llm_operator.images import Images
from llm_operator.plan.types import PoolPlan
from llm_operator.render import names
from llm_operator.render.children import PoolEngine, serving_pool
from llm_operator.render.inject import INJECT_VOLUME
from llm_operator.render.pod import SECRET_FS_GROUP, memory_bytes
from llm_operator.render.serving import LWS_GROUP_INDEX, POD_INDEX, workloads
from llm_operator.rollout.revision import Slot
from llm_operator.runtime.config import PodConfig
from llm_operator.storage import engine_location

from tests import upstream_names as up

REPO = Path(__file__).resolve().parents[2]
H100 = "NVIDIA-H100-80GB-HBM3"
IMAGES = Images("runtime", "cpu-runtime", "builder", "0.20.0")
ENGINE = engine_location("pvc://llm-engine-cache/engines", "llama-fp8-tp8pp2-sm90-abc")
GROUP = 1  # the replica (group) whose pods the tests address
UID = "0f6c1d2e-5b7a-4c39-9e41-7d2b8a6f3c10"
SPEC = LLMDeploymentSpec.model_validate({
    "model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"}},
    "engine": {"backend": "tensorrt-engine"},  # ENGINE's: the pods read what the build wrote
    "runtime": {"exitTimeoutSeconds": 45},
})  # fmt: skip
SINGLE = PoolPlan("main", H100, (H100,), (9, 0), 81559, 4, 1, 4, 1, 2)
MULTI = PoolPlan("main", H100, (H100,), (9, 0), 81559, 8, 2, 8, 2, 2)


def pod_specs(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if workload["kind"] == "LeaderWorkerSet":
        lwt = workload["spec"]["leaderWorkerTemplate"]
        return {"leader": lwt["leaderTemplate"]["spec"], "worker": lwt["workerTemplate"]["spec"]}
    return {workload["metadata"]["labels"]["llmoperator.io/role"]: workload["spec"]["template"]["spec"]}


ADMIN_KEY = "ab" * 32  # what the kubelet reads from the admin-key Secret


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would set it, for a pod of group GROUP."""
    labels = {POD_INDEX: str(GROUP), LWS_GROUP_INDEX: str(GROUP)}
    secrets = {(names.admin_key_secret("llama", UID), contract.ADMIN_KEY_SECRET_KEY): ADMIN_KEY}
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        if "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets[(ref["name"], ref["key"])]
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        if path == "metadata.name":
            env[entry["name"]] = f"pod-{GROUP}"
        else:
            label = path.removeprefix("metadata.labels['").removesuffix("']")
            env[entry["name"]] = labels[label]
    return env


def shapes() -> list[tuple[str, PoolPlan, str, dict[str, Any]]]:
    """(shape, pool, role, pod spec) of every pod kind the builders emit."""
    single = workloads("llama", "ns", SPEC, SINGLE, IMAGES, ENGINE, "h", uid=UID, revision="r1")
    statefulsets = workloads("llama", "ns", SPEC, MULTI, IMAGES, ENGINE, "h", uid=UID, revision="r1")
    (lws,) = workloads(
        "llama", "ns", SPEC, MULTI, IMAGES, ENGINE, "h", uid=UID, revision="r1", leader_worker_set=True
    )
    out = [("single", SINGLE, role, pod) for role, pod in pod_specs(single[0]).items()]
    for sts in (statefulsets[0], statefulsets[1 + GROUP]):
        out += [("statefulset", MULTI, role, pod) for role, pod in pod_specs(sts).items()]
    out += [("leader-worker-set", MULTI, role, pod) for role, pod in pod_specs(lws).items()]
    return out


SHAPES = shapes()


@pytest.mark.parametrize(("shape", "pool", "role", "pod"), SHAPES, ids=[f"{s[0]}-{s[2]}" for s in SHAPES])
def test_the_launcher_reads_what_the_builder_renders(
    shape: str, pool: PoolPlan, role: str, pod: dict[str, Any]
) -> None:
    (container,) = pod["containers"]
    env = environment(container)
    rendered = {e["name"] for e in container["env"]}
    # HOME is for the processes the launcher starts (the root filesystem is read-only); PYTHONPATH
    # is where python3 finds the launcher itself.
    assert rendered - {contract.POD_NAME_ENV, "HOME", "PYTHONPATH"} <= set(contract.ENV), (
        "a variable the launcher ignores"
    )

    c = PodConfig.from_env(env)
    assert (c.tp, c.pp, c.gpus_per_pod, c.pods_per_replica) == (
        pool.tensor, pool.pipeline, pool.gpus_per_pod, pool.pods_per_replica,
    )  # fmt: skip
    assert c.role == role and c.exit_timeout == SPEC.runtime.exit_timeout_seconds
    # Only a leader serves HTTP and gRPC: only it gets the key of the admin APIs.
    assert c.admin_key == (ADMIN_KEY if role == "leader" else "")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (c.http_port, c.grpc_port, c.metrics_port) == (ports["http"], ports["grpc"], ports["metrics"])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert c.model_repo_src == mounts["model-repo-src"]["mountPath"]
    assert c.engine_dir.startswith(mounts["engine-cache"]["mountPath"] + "/")
    assert c.engine_dir == ENGINE.engine_dir
    writable = [m["mountPath"] for m in mounts.values() if not m.get("readOnly")]
    assert c.model_repo in writable and any(c.runtime_dir.startswith(w + "/") for w in writable)

    # The image's python3 runs the launcher from the copy the init container made (render/inject.py).
    assert container["command"] == ["python3", "-m", "llm_operator.runtime.launcher"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [*container["command"], "drain"]
    assert env["PYTHONPATH"] == mounts[INJECT_VOLUME]["mountPath"] and mounts[INJECT_VOLUME]["readOnly"]
    (init,) = pod["initContainers"]
    assert init["image"] == IMAGES.launcher and init["command"][-1] == env["PYTHONPATH"]
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {INJECT_VOLUME: env["PYTHONPATH"]}
    assert (
        pod["terminationGracePeriodSeconds"] >= c.drain_timeout + c.exit_timeout + contract.KILL_GRACE_SECONDS
    )

    volumes = {v["name"]: v for v in pod["volumes"]}
    if shape == "single":
        assert contract.LAUNCH_VOLUME not in volumes, "single pods need no launch identity"
        return
    assert mounts[contract.LAUNCH_VOLUME] == {
        "name": contract.LAUNCH_VOLUME,
        "mountPath": c.launch_identity_dir,
        "readOnly": True,
    }
    secret = volumes[contract.LAUNCH_VOLUME]["secret"]
    assert secret["secretName"] == names.launch_secret("llama", UID)
    assert c.group == GROUP
    # Each role gets only its half of the identity, readable by owner (root) and the pod's fsGroup.
    want = contract.LEADER_LAUNCH_FILES if role == "leader" else contract.WORKER_LAUNCH_FILES
    assert [i["key"] for i in secret["items"]] == [i["path"] for i in secret["items"]] == list(want)
    assert secret["defaultMode"] == 0o440 and all("mode" not in i for i in secret["items"])
    assert pod["securityContext"]["fsGroup"] == SECRET_FS_GROUP


@pytest.mark.parametrize(("shape", "pool", "role", "pod"), SHAPES, ids=[f"{s[0]}-{s[2]}" for s in SHAPES])
def test_serving_pods_write_only_to_their_volumes(
    shape: str, pool: PoolPlan, role: str, pod: dict[str, Any]
) -> None:
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert all("emptyDir" in volumes[m["name"]] for m in container["volumeMounts"] if not m.get("readOnly"))
    c = PodConfig.from_env(environment(container))
    home = environment(container)["HOME"]
    for path in (c.model_repo, c.runtime_dir, home, "/tmp", "/dev/shm"):
        assert any(path == w or path.startswith(w + "/") for w in writable), path


def test_the_memory_limit_leaves_room_for_a_full_shm() -> None:
    spec = SPEC.model_copy(update={"resources": SPEC.resources.model_copy(update={"memory": "64Gi"})})
    (sts,) = workloads("llama", "ns", spec, SINGLE, IMAGES, ENGINE, "h", uid=UID, revision="r1")
    (container,) = pod_specs(sts)["leader"]["containers"]
    # /dev/shm (16Gi by default) is charged to the pod's memory on top of what the processes use.
    assert container["resources"]["requests"]["memory"] == "64Gi"
    assert container["resources"]["limits"]["memory"] == "80Gi"
    (no_request,) = workloads("llama", "ns", SPEC, SINGLE, IMAGES, ENGINE, "h", uid=UID, revision="r1")
    assert "memory" not in pod_specs(no_request)["leader"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("2Gi", 2 * 2**30), ("256Mi", 256 * 2**20), ("1G", 10**9), ("1.5Gi", 3 * 2**29), ("1e3", 1000),
     ("100", 100), ("1500m", 2)],
)  # fmt: skip
def test_memory_quantities(quantity: str, expected: int) -> None:
    assert memory_bytes(quantity) == expected


@pytest.mark.parametrize("lws", [False, True], ids=["statefulset", "leader-worker-set"])
def test_leader_and_workers_address_each_other_by_their_pod_names(lws: bool) -> None:
    """The leader's worker pattern names the worker pods the builder creates, and a worker finds
    its own leader (drain), in both multi-node shapes."""
    objs = workloads(
        "llama", "ns", SPEC, MULTI, IMAGES, ENGINE, "h", uid=UID, revision="r1", leader_worker_set=lws
    )
    shape = [s for s in SHAPES if s[0] == ("leader-worker-set" if lws else "statefulset")]
    leader, worker = (PodConfig.from_env(environment(s[3]["containers"][0])) for s in shape)
    if lws:
        name = objs[0]["metadata"]["name"]  # LWS pods: <name>-<group>, <name>-<group>-<worker>
        worker_pod, service = f"{name}-{GROUP}-1", name
        # LWS injects LWS_LEADER_ADDRESS itself, which the launcher reads when LLMOP_LEADER_HOST is unset.
        assert worker.leader_host == ""
    else:
        leader_sts, worker_sts = objs[0], objs[1 + GROUP]
        worker_pod = f"{worker_sts['metadata']['name']}-{worker_sts['spec']['ordinals']['start']}"
        service = leader_sts["spec"]["serviceName"]
        assert worker.leader_host == f"{leader_sts['metadata']['name']}-{GROUP}.{service}.ns.svc"
    assert leader.worker_host_pattern.format(group=GROUP, worker=1) == f"{worker_pod}.{service}.ns.svc"


@pytest.mark.parametrize("lws", [False, True], ids=["statefulset", "leader-worker-set"])
def test_multi_node_pods_mount_the_secret_the_controller_creates(lws: bool) -> None:
    ld = LLMDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "ns", "uid": UID}, "spec": SPEC.model_dump(by_alias=True)}
    )
    objs = serving_pool(
        ld, MULTI, IMAGES, PoolEngine(ENGINE, "k", True), slot=Slot.A, revision="r1", leader_worker_set=lws
    )
    pods = [
        spec
        for o in objs
        if o["kind"] in ("StatefulSet", "LeaderWorkerSet")
        for spec in pod_specs(o).values()
    ]
    mounted = {v["secret"]["secretName"] for pod in pods for v in pod["volumes"] if "secret" in v}
    assert len(pods) == (2 if lws else 1 + MULTI.replicas)
    assert mounted == {launch_secret(ld)["metadata"]["name"]}


def test_the_container_command_is_the_launchers_entry_point() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[contract.LAUNCHER] == "llm_operator.runtime.launcher:main"
    # `python3 -m` runs the module's main, the one the console script of a dev install runs.
    assert ("python3", "-m", scripts[contract.LAUNCHER].split(":")[0]) == contract.CONTAINER_COMMAND
    assert (*contract.CONTAINER_COMMAND, "drain") == contract.PRESTOP_COMMAND


def tokenizer_dirs(ld: LLMDeployment, engine: PoolEngine) -> tuple[PodConfig, dict[str, Any], set[str]]:
    """The leader's launcher config, pod spec, and the tokenizer_dir pre/postprocessing load."""
    objs = serving_pool(ld, SINGLE, IMAGES, engine, slot=Slot.A, revision="r1", leader_worker_set=False)
    configmap = next(o for o in objs if o["kind"] == "ConfigMap")
    pod = next(pod_specs(o)["leader"] for o in objs if o["kind"] == "StatefulSet")
    loaded = {
        text.split('key: "tokenizer_dir" value: { string_value: "', 1)[1].split('"', 1)[0]
        for key, text in configmap["data"].items()
        if key in ("preprocessing__config.pbtxt", "postprocessing__config.pbtxt")
    }
    return PodConfig.from_env(environment(pod["containers"][0])), pod, loaded


def test_the_launcher_checks_the_tokenizer_pre_and_postprocessing_load() -> None:
    spec = SPEC.model_dump(by_alias=True)
    spec["runtime"]["tokenizerUri"] = "pvc://models/llama3-70b/tokenizer/"
    ld = LLMDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "ns", "uid": UID}, "spec": spec}
    )
    c, pod, loaded = tokenizer_dirs(ld, PoolEngine(ENGINE, "k", True))
    assert (
        loaded == {c.tokenizer_dir} and c.tokenizer_dir == f"{contract.TOKENIZER_MOUNT}/llama3-70b/tokenizer"
    )
    # The claim is mounted whole and read-only: a path missing inside it reaches the launcher's
    # preflight, which names it, instead of failing the kubelet's subPath mount.
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "tokenizer"]
    assert mount == {"name": "tokenizer", "mountPath": contract.TOKENIZER_MOUNT, "readOnly": True}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tokenizer"]
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert pod["containers"][0]["terminationMessagePath"] == c.termination_log == contract.TERMINATION_LOG

    # Unset: the tokenizer an engine build copies into <engine>/tokenizer (engine/build.py).
    plain = LLMDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "ns", "uid": UID}, "spec": SPEC.model_dump(by_alias=True)}
    )
    c, pod, loaded = tokenizer_dirs(plain, PoolEngine(ENGINE, "k", True))
    assert loaded == {c.tokenizer_dir} == {f"{ENGINE.engine_dir}/tokenizer"}
    assert "tokenizer" not in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize("uri", ["s3://m/tokenizer", "hf://meta-llama/Llama-3", "/models/tok", "pvc://"])
def test_a_tokenizer_serving_pods_cannot_mount_is_refused(uri: str) -> None:
    spec = SPEC.model_dump(by_alias=True)
    spec["runtime"]["tokenizerUri"] = uri
    with pytest.raises(ValueError, match=r"runtime\.tokenizerUri must be pvc://CLAIM/PATH"):
        LLMDeploymentSpec.model_validate(spec)


def test_serving_reads_the_tokenizer_where_the_build_copies_it() -> None:
    """engine/build.py copies the tokenizer to <--output>/tokenizer (copy_tokenizer, then the
    rename into place); serving pods of that key load and check that same directory."""
    key = cache_key(SPEC, SINGLE, "1.1.0")
    job = build_job("llama", "ns", SPEC, SINGLE, key, image="b", images=IMAGES, owner={})
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    built = build.parse(args[args.index("--key") :])
    ld = LLMDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "ns", "uid": UID}, "spec": SPEC.model_dump(by_alias=True)}
    )
    c, _, loaded = tokenizer_dirs(ld, PoolEngine(engine_location(SPEC.engine.cache.uri, key), key, True))
    assert loaded == {c.tokenizer_dir} == {f"{built.output}/tokenizer"}


def _info(**changes: Any) -> str:
    """Upstream's file (tests/upstream_names.py) with `changes`; a value None drops the key."""
    info = {**up.XGRAMMAR_TOKENIZER_INFO_EXAMPLE, **changes}
    return json.dumps({k: v for k, v in info.items() if v is not None})


VALID_INFO = _info()
# Each is a file the C++ backend's read throws on (nlohmann::json::parse, get<> of each key's type),
# failing the model's load: the check names it.
UNLOADABLE_INFO = {
    "truncated": VALID_INFO[: len(VALID_INFO) // 2],
    "empty": "",
    "not an object": "[]",
    "not UTF-8": '{"encoded_vocab": ["\xff"]}',
    "no encoded_vocab": _info(encoded_vocab=None),
    "empty encoded_vocab": _info(encoded_vocab=[]),
    "a token not a string": _info(encoded_vocab=["a", 1]),
    "tiktoken: no tokenizer_str": _info(tokenizer_str=None),
    "no eos token": _info(stop_token_ids=[None]),
    "stop ids not a list": _info(stop_token_ids=1),
    "a stop id past int32": _info(stop_token_ids=[2**31]),
    "a negative stop id": _info(stop_token_ids=[-1]),
    "a bool stop id": _info(stop_token_ids=[True]),
}


def test_the_tokenizer_info_upstream_writes_passes_the_check_a_missing_one_does_not(tmp_path: Path) -> None:
    path = tmp_path / contract.XGRAMMAR_TOKENIZER_INFO
    assert contract.tokenizer_info_problem(path) == f"{path} not found"
    path.mkdir()
    assert "IsADirectoryError" in contract.tokenizer_info_problem(path)
    path.rmdir()
    path.write_text(VALID_INFO)
    assert contract.tokenizer_info_problem(path) == ""


@pytest.mark.parametrize("text", UNLOADABLE_INFO.values(), ids=UNLOADABLE_INFO.keys())
def test_a_tokenizer_info_file_the_guided_decoder_cannot_load_is_named(tmp_path: Path, text: str) -> None:
    """One check for the build, the launcher and the front door (contract.tokenizer_info_problem):
    a file torn or shaped otherwise than upstream's fails it, with its path."""
    path = tmp_path / contract.XGRAMMAR_TOKENIZER_INFO
    path.write_bytes(text.encode("latin-1"))
    assert contract.tokenizer_info_problem(path).startswith(str(path))
