"""The model cache end to end, on the embedded cluster's real node: cpu-reference deployments whose
weights and tokenizer come from the test world's S3 server (versitygw) and Hugging Face mirror
(olah), fetched by the operator's fetch Jobs into a claim, read by the serving pods from there, and
answered through the OpenAI API with the text of the checkpoint's seed (runtime/cpu_reference/
checkpoint.py: the stores hold seed 0 and seed 1, e2e/cluster/artifacts.py).

- From S3: fetched once (one GET per object in the server's access log), status.model names the
  directory, bytes and files, ModelCached is True, and an Event ModelFetched says so.
- A second deployment of the same source and claim starts no Job and downloads nothing; deleting it
  leaves the weights, and the first keeps serving.
- From the mirror at a pinned revision (tag v1): the resolved commit is the tag's; changing the
  revision to `main` fetches it while the old pod keeps answering (no failed request), then the
  deployment serves main's text.
- Wrong credentials, a missing bucket, a missing revision: Stalled with the fetcher's reason and the
  server's own words, from the first and only pod of the Job (no retries in silence).
- A claim too small for the model (a tmpfs of 512 KiB on the node): Stalled, CacheFull, with the
  bytes needed and free, as soon as the Job's only pod fails; nothing downloaded or written.
- A fetch pod deleted mid-download (the operator's bandwidth cap, LLMOP_FETCH_MAX_BYTES_PER_SECOND,
  makes the download last seconds): its replacement keeps the files it had verified (one GET each)
  and asks S3 only for the rest.

The claim is a hostPath PersistentVolume on the real node (this machine's filesystem), so the test
sees what the fetcher wrote. Serving pods are few and small: the node has 2 CPUs.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.contract import MODEL_CACHE_MOUNT
from llm_operator.modelcache.layout import MANIFEST, VERIFIED
from llm_operator.runtime.cpu_reference import TINY_MODELS, checkpoint
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from e2e.chat import base_url
from e2e.cluster import artifacts
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from tests.e2e import openai_sdk
from tests.e2e.operator_fixtures import OperatorProcess
from tests.e2e.stores import hub_gets, s3_gets

pytestmark = [pytest.mark.e2e, pytest.mark.own_operator]  # with a fetch rate cap

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLAIM = "llm-model-cache"
# A claim too small for the checkpoint (seed_files: 0.82 MiB): a tmpfs of 512 KiB.
SMALL_CLAIM, SMALL_CLAIM_BYTES = "llm-small-cache", 512 * 1024
CREDENTIALS, WRONG_CREDENTIALS = "s3-keys", "s3-wrong-keys"
# 853 kB of weights at 150 kB/s: a fetch lasts seconds, long enough to delete its pod halfway.
MAX_BYTES_PER_SECOND = 150_000
READY_WITHIN = 300  # seconds from apply: a fetch, then a serving pod loading on a busy node
STALL_WITHIN = 120  # seconds from apply: one fetch pod's start and its failure
PROMPT, MAX_TOKENS = "Once upon a time", 16
S3_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
FETCH_PODS = "app.kubernetes.io/component=model-fetch"
SERVING_PODS = "app.kubernetes.io/component!=model-fetch"
S3_DIRECTORY = r"models/s3-[0-9a-f]{16}/etags-[0-9a-f]{16}"
HF_DIRECTORY = r"models/hf-[0-9a-f]{16}/[0-9a-f]{40}"


def seed_text(seed: int) -> str:
    """What a greedy completion of PROMPT is for the checkpoint of `seed`."""
    return "".join(TinyLM(TINY_MODELS["tiny-llama"], seed).generate(PROMPT, MAX_TOKENS))


@functools.cache
def seed_files(seed: int) -> dict[str, bytes]:
    """The files of the checkpoint of `seed`, as the test world's stores were given them."""
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.write(tmp, seed=seed)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir()}


@dataclass
class World:
    cluster: E2ECluster
    kubectl: Kubectl
    namespace: str
    stores: artifacts.Stores
    claim_dir: Path  # the claim's directory on the node
    operator: OperatorProcess
    commits: dict[str, str] = field(default_factory=dict)  # mirror revision -> commit

    def get(self, name: str) -> dict[str, Any]:
        return self.kubectl.get("llmdeployment", name, self.namespace) or {}

    def apply(self, doc: dict[str, Any]) -> None:
        self.kubectl.apply(doc, namespace=self.namespace)

    def ready(self, name: str, timeout: float = READY_WITHIN) -> dict[str, Any]:
        return wait_for(
            f"{name} Ready", lambda: self.get(name), lambda ld: is_true(ld, "Ready"), timeout=timeout
        )

    def complete(self, name: str) -> str:
        """A greedy completion through the OpenAI SDK at the base URL status.endpoints.openai names."""
        assert self.cluster.launcher is not None
        url = self.get(name)["status"]["endpoints"]["openai"]
        with base_url(self.cluster.launcher, url) as base:
            done = openai_sdk.client(base).completions.create(
                model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
            )
        return str(done.choices[0].text)

    def fetch_jobs(self, name: str) -> list[dict[str, Any]]:
        return self.kubectl.items("jobs", self.namespace, f"llmoperator.io/deployment={name},{FETCH_PODS}")

    def pods(self, name: str, which: str = SERVING_PODS) -> list[dict[str, Any]]:
        return self.kubectl.items("pods", self.namespace, f"llmoperator.io/deployment={name},{which}")


def tiny(name: str, source: dict[str, Any], **model: Any) -> dict[str, Any]:
    """examples/cpu-reference.yaml as `name`, its model from `source` into the claim; small pods."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"].update(source=source, cache={"claimName": CLAIM}, **model)
    doc["spec"]["resources"].update(cpu="500m", memory="1Gi")
    return doc


def s3_source(
    stores: artifacts.Stores, bucket: str, prefix: str, secret: str = CREDENTIALS
) -> dict[str, Any]:
    return {
        "uri": f"s3://{bucket}/{prefix}",
        "endpoint": stores.s3_endpoint,
        "region": artifacts.REGION,
        "pathStyle": True,
        "credentialsSecretRef": {"name": secret},
    }


def hf_source(stores: artifacts.Stores) -> dict[str, Any]:
    return {"uri": f"hf://{artifacts.HF_REPO}", "endpoint": stores.hf_endpoint}


@pytest.fixture(scope="module")
def world(
    crd: None,
    cluster: E2ECluster,
    kubectl: Kubectl,
    own_namespaces: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """A namespace with the cache claim and the S3 keys' Secrets, and an operator whose fetch Jobs
    are capped at MAX_BYTES_PER_SECOND."""
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its stores, real node and images")
    stores = cluster.launcher.stores
    ns = kubectl.create_namespace(f"{own_namespaces}-model-cache")
    pv = f"{ns}-model-cache"
    claim_dir = Path("/tmp") / pv
    claim_dir.mkdir()
    claim_dir.chmod(0o777)  # a hostPath volume gets no fsGroup: the fetch pod's uid writes it
    operator = None
    try:
        kubectl.apply(claim_and_secrets(ns, pv, claim_dir, stores))
        operator = OperatorProcess(
            cluster,
            tmp_path_factory.mktemp("operator") / "operator.log",
            ("--namespace", ns),
            LLMOP_FETCH_MAX_BYTES_PER_SECOND=str(MAX_BYTES_PER_SECOND),
        )
        operator.wait_healthy()
        repo = stores.mirrors / "models" / artifacts.HF_REPO
        commits = {
            revision: subprocess.check_output(
                ["git", "-C", str(repo), "rev-parse", f"{revision}^{{commit}}"], text=True
            ).strip()
            for revision, _ in artifacts.HF_REVISIONS
        }
        yield World(cluster, kubectl, ns, stores, claim_dir, operator, commits)
    finally:
        if operator is not None:
            operator.stop()
            if operator.proc.returncode not in (0, -15):
                print(f"operator log ({operator.log_path}):\n{operator.log()[-5000:]}")
        kubectl.delete_namespace(ns, timeout=180)
        kubectl.delete("persistentvolume", pv)
        shutil.rmtree(claim_dir, ignore_errors=True)


def claim(ns: str, pv: str, claim_dir: Path, name: str = CLAIM) -> list[dict[str, Any]]:
    """Claim `name`, bound to `claim_dir` on the node."""
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                  "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                  "hostPath": {"path": str(claim_dir), "type": "Directory"},
                  "claimRef": {"namespace": ns, "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]  # fmt: skip


def claim_and_secrets(ns: str, pv: str, claim_dir: Path, stores: artifacts.Stores) -> list[dict[str, Any]]:
    """The cache claim, bound to `claim_dir` on the node, and the S3 keys, right and wrong."""
    wrong = {**stores.credentials, "AWS_SECRET_ACCESS_KEY": "not-the-secret-key"}
    return [
        *claim(ns, pv, claim_dir),
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": CREDENTIALS, "namespace": ns},
         "stringData": stores.credentials},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WRONG_CREDENTIALS, "namespace": ns},
         "stringData": wrong},
    ]  # fmt: skip


def assert_cached(world: World, ld: dict[str, Any], pattern: str, seed: int) -> dict[str, Any]:
    """status.model of a fetched model, and its directory on the claim: whole (its manifest, no
    partial left), the checkpoint's own bytes."""
    model: dict[str, Any] = ld["status"]["model"]
    assert re.fullmatch(pattern, model["directory"]), model
    assert model["directory"].endswith(f"/{model['resolvedRevision']}"), model
    directory = world.claim_dir / model["directory"]
    fetched = {p.name: p.read_bytes() for p in directory.iterdir() if p.name not in (MANIFEST, VERIFIED)}
    assert model["filesFetched"] == model["filesTotal"] == len(fetched), (model, sorted(fetched))
    assert model["bytesFetched"] == model["bytesTotal"] == sum(map(len, fetched.values())), model
    fetched.pop(".gitattributes", None)  # the Hub repository's own file, fetched with the model
    assert fetched == seed_files(seed), sorted(fetched)
    assert (directory / MANIFEST).is_file()
    assert not list(directory.parent.glob(".partial-*")), "nothing half-fetched is left"
    cached = condition(ld, "ModelCached") or {}
    assert cached.get("status") == "True" and cached.get("reason") == "ModelCached", cached
    return model


def s3_counts(world: World, prefix: str) -> dict[str, int]:
    """GetObject requests per file of `prefix`, from versitygw's access log."""
    return {name: s3_gets(world.stores, f"{prefix}/{name}") for name in S3_FILES}


def test_sources_that_cannot_be_read_stall_with_the_servers_status_and_code(world: World) -> None:
    """The three side by side, each Stalled from its Job's first and only pod. First in the module:
    a source the claim already holds is served whatever the credentials (the index is keyed by
    claim, source and revision), so the wrong keys must meet a model not fetched yet."""
    stores = world.stores
    cases = {
        # name: (source, revision, the fetcher's reason, the server's error code)
        "wrong-keys": (s3_source(stores, artifacts.BUCKET, "tiny-llama", WRONG_CREDENTIALS), None,
                       "SourceUnauthorized", "SignatureDoesNotMatch"),
        "no-bucket": (s3_source(stores, "no-such-bucket", "tiny-llama"), None,
                      "SourceNotFound", "NoSuchBucket"),
        "no-revision": (hf_source(stores), "v9", "RevisionNotFound", "RepoNotFound"),
    }  # fmt: skip
    started = time.monotonic()
    for name, (source, revision, _, _) in cases.items():
        world.apply(tiny(name, source, **({"revision": revision} if revision else {})))
    for name, (_, _, reason, words) in cases.items():
        ld = wait_for(
            f"{name} Stalled",
            functools.partial(world.get, name),
            lambda ld: is_true(ld, "Stalled"),
            timeout=STALL_WITHIN,
        )
        stalled, cached = condition(ld, "Stalled") or {}, condition(ld, "ModelCached") or {}
        assert stalled["reason"] == cached["reason"] == reason, (stalled, cached)
        assert cached["status"] == "False" and not is_true(ld, "Ready"), ld["status"]
        assert words in stalled["message"], stalled["message"]
        assert stores.secret_key not in json.dumps(ld), "no secret in status"
        # Exit 78 fails the Job at once (podFailurePolicy) rather than retrying in silence.
        (job,) = world.fetch_jobs(name)
        assert job["status"].get("failed") == 1 and len(world.pods(name, FETCH_PODS)) == 1, job["status"]
        print(f"{name}: Stalled {time.monotonic() - started:.0f} s after apply: {stalled['message']}")
    for name in cases:
        world.kubectl.delete("llmdeployment", name, world.namespace)


@pytest.fixture
def small_claim(world: World) -> Iterator[Path]:
    """SMALL_CLAIM, bound to a tmpfs of SMALL_CLAIM_BYTES mounted on the node: a filesystem really
    too small for the checkpoint (the model cache checks the claim's free space with statvfs)."""
    pv = f"{world.namespace}-small-cache"
    mount = Path("/tmp") / pv
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_CLAIM_BYTES},mode=0777", "tmpfs", str(mount)],
                   check=True)  # fmt: skip
    try:
        world.kubectl.apply(claim(world.namespace, pv, mount, SMALL_CLAIM), namespace=world.namespace)
        yield mount
    finally:
        world.kubectl.delete("llmdeployment", "too-big", world.namespace, wait=True)
        world.kubectl.delete("persistentvolumeclaim", SMALL_CLAIM, world.namespace)
        world.kubectl.delete("persistentvolume", pv)
        subprocess.run(["umount", "--lazy", str(mount)], check=True)
        mount.rmdir()


def test_a_model_bigger_than_its_claim_stalls_with_the_numbers(world: World, small_claim: Path) -> None:
    """CacheFull from the fetcher's check of the claim's free space, before it downloads anything:
    Stalled as soon as the Job fails, one pod, no GET, no serving pod, no model directory."""
    before = s3_counts(world, "tiny-llama")
    doc = tiny("too-big", s3_source(world.stores, artifacts.BUCKET, "tiny-llama"))
    doc["spec"]["model"]["cache"]["claimName"] = SMALL_CLAIM
    started = time.monotonic()
    world.apply(doc)
    ld = wait_for("too-big Stalled", lambda: world.get("too-big"), lambda ld: is_true(ld, "Stalled"),
                  timeout=STALL_WITHIN)  # fmt: skip
    took = time.monotonic() - started
    stalled, cached = condition(ld, "Stalled") or {}, condition(ld, "ModelCached") or {}
    assert stalled["reason"] == cached["reason"] == "CacheFull" and cached["status"] == "False", ld["status"]
    numbers = re.search(
        r"needs ([\d.]+) MiB, the claim has ([\d.]+) MiB free of ([\d.]+) MiB", stalled["message"]
    )
    assert numbers, stalled["message"]
    needed, free, size = map(float, numbers.groups())
    assert needed == round(sum(map(len, seed_files(0).values())) / 2**20, 2), stalled["message"]
    assert free < needed and size == SMALL_CLAIM_BYTES / 2**20, stalled["message"]
    # Stalled as the Job's pod exits (the reconciler watches its pods and Jobs), not at a resync.
    (pod,) = world.pods("too-big", FETCH_PODS)
    (container,) = pod["status"]["containerStatuses"]
    ended = container["state"]["terminated"]
    assert ended["exitCode"] == 78, ended  # permanent: the Job fails at once
    lag = since(stalled["lastTransitionTime"]) - since(ended["finishedAt"])
    assert 0 <= lag <= 5, (ended, stalled)
    # One pod, no download, and a while later still no second try: the retry waits RETRY_SECONDS.
    time.sleep(5)
    (job,) = world.fetch_jobs("too-big")
    assert job["status"].get("failed") == 1 and len(world.pods("too-big", FETCH_PODS)) == 1, job["status"]
    assert s3_counts(world, "tiny-llama") == before, "nothing downloaded"
    # Nothing to serve from: no serving pod, no model directory, nothing written.
    assert world.pods("too-big") == [] and not is_true(world.get("too-big"), "Ready")
    assert not list(small_claim.glob(f"models/*/*/{MANIFEST}")), "no model directory"
    assert not [p for p in small_claim.rglob("*") if p.is_file() and p.stat().st_size], "nothing written"
    print(f"too-big: Stalled {took:.0f} s after apply, {lag:.0f} s after its pod ended: {stalled['message']}")


def test_a_model_from_s3_is_fetched_once_and_served(world: World) -> None:
    before = s3_counts(world, "tiny-llama")
    started = time.monotonic()
    world.apply(tiny("from-s3", s3_source(world.stores, artifacts.BUCKET, "tiny-llama")))
    ld = world.ready("from-s3")
    took = time.monotonic() - started
    model = assert_cached(world, ld, S3_DIRECTORY, seed=0)
    assert world.complete("from-s3") == seed_text(0)
    assert s3_counts(world, "tiny-llama") == {name: n + 1 for name, n in before.items()}, "each object once"
    wait_for(
        "a Normal Event ModelFetched",
        lambda: [e for e in world.kubectl.events(world.namespace, "from-s3")
                 if e["reason"] == "ModelFetched" and e["type"] == "Normal"],
    )  # fmt: skip
    # The serving pod reads the cached directory, which is its tokenizer directory too.
    (pod,) = world.pods("from-s3")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    mounted = f"{MODEL_CACHE_MOUNT}/{model['directory']}"
    assert env["LLMOP_MODEL_DIR"] == env["LLMOP_TOKENIZER_DIR"] == mounted, env
    print(
        f"from-s3: Ready {took:.0f} s after apply, {model['bytesTotal']} bytes in {model['filesTotal']} files"
    )


def test_a_second_deployment_of_the_same_source_downloads_nothing(world: World) -> None:
    first = world.get("from-s3")["status"]["model"]
    before = s3_counts(world, "tiny-llama")
    world.apply(tiny("from-s3-again", s3_source(world.stores, artifacts.BUCKET, "tiny-llama")))
    ld = world.ready("from-s3-again")
    assert ld["status"]["model"]["directory"] == first["directory"]
    assert world.fetch_jobs("from-s3-again") == [], "a model already in the claim starts no Job"
    assert s3_counts(world, "tiny-llama") == before, "nothing downloaded"
    assert world.complete("from-s3-again") == seed_text(0)

    # Deleting a deployment deletes no weights: the other one still reads them.
    world.kubectl.delete("llmdeployment", "from-s3-again", world.namespace, wait=True, timeout=120)
    assert (world.claim_dir / first["directory"] / "model.safetensors").is_file()
    assert world.complete("from-s3") == seed_text(0)
    world.kubectl.delete("llmdeployment", "from-s3", world.namespace)  # its CPU for what follows


@dataclass
class Asker:
    """Completions one after another in a thread, each outcome recorded with its wall-clock end
    (comparable with the API server's timestamps: one host)."""

    world: World
    name: str
    outcomes: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), text or "error: ...")
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                text = self.world.complete(self.name)
            except Exception as e:  # recorded: the test fails on it
                text = f"error: {type(e).__name__}: {e}"
            self.outcomes.append((time.time(), text))
            time.sleep(0.2)


def since(timestamp: str) -> float:
    """A Kubernetes timestamp (RFC 3339, whole seconds) as time.time() would give it."""
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def test_a_model_from_the_hub_mirror_at_a_pinned_revision_then_another(world: World) -> None:
    source = hf_source(world.stores)
    world.apply(tiny("from-hub", source, revision="v1"))
    model = assert_cached(world, world.ready("from-hub"), HF_DIRECTORY, seed=0)
    assert model["resolvedRevision"] == world.commits["v1"]
    assert world.complete("from-hub") == seed_text(0)

    # main (seed 1) is fetched while the v1 pod keeps answering, with v1's text.
    weights_before = hub_gets(world.stores, "model.safetensors")
    asker = Asker(world, "from-hub")
    thread = threading.Thread(target=asker.run, daemon=True)
    thread.start()
    changed = time.time()
    try:
        world.apply(tiny("from-hub", source, revision="main"))
        ld = wait_for(
            "main fetched",
            lambda: world.get("from-hub"),
            lambda ld: (
                is_true(ld, "ModelCached")
                and ld["status"]["model"].get("resolvedRevision") == world.commits["main"]
            ),
            timeout=READY_WITHIN,
        )
    finally:
        asker.stop.set()
        thread.join(timeout=90)
    # Until main is cached the pods are held; from then on the one replica is replaced.
    fetched = since((condition(ld, "ModelCached") or {})["lastTransitionTime"])
    meanwhile = [text for at, text in asker.outcomes if changed <= at < fetched]
    assert meanwhile and all(text == seed_text(0) for text in meanwhile), meanwhile
    assert hub_gets(world.stores, "model.safetensors") == weights_before + 1

    ld = wait_for(
        "from-hub Ready on main",
        lambda: world.get("from-hub"),
        lambda ld: (
            is_true(ld, "Ready") and ld["status"]["model"].get("resolvedRevision") == world.commits["main"]
        ),
        timeout=READY_WITHIN,
    )
    assert_cached(world, ld, HF_DIRECTORY, seed=1)
    assert wait_for(
        "main's text", lambda: world.complete("from-hub"), lambda t: t == seed_text(1), timeout=120
    )
    assert seed_text(1) != seed_text(0)
    print(f"from-hub: {len(meanwhile)} completions answered by the v1 pod while main was fetched "
          f"({fetched - changed:.0f} s)")  # fmt: skip
    world.kubectl.delete("llmdeployment", "from-hub", world.namespace)


def test_a_fetch_pod_killed_mid_download_resumes_without_refetching_verified_files(world: World) -> None:
    prefix = "tiny-llama-v2"  # seed 1: fetched by no other test here
    before = s3_counts(world, prefix)
    world.apply(tiny("resumed", s3_source(world.stores, artifacts.BUCKET, prefix)))

    def halfway() -> Path | None:
        for weights in world.claim_dir.glob("models/s3-*/.partial-*/model.safetensors"):
            if weights.stat().st_size > 100_000 and (weights.parent / VERIFIED).is_file():
                return weights
        return None

    weights = wait_for("model.safetensors halfway", halfway, timeout=STALL_WITHIN, interval=0.05)
    assert weights is not None
    verified = set(json.loads((weights.parent / VERIFIED).read_text()))
    (killed,) = world.pods("resumed", FETCH_PODS)
    world.kubectl.delete("pod", killed["metadata"]["name"], world.namespace)
    assert verified and "model.safetensors" not in verified, verified

    ld = world.ready("resumed")
    assert_cached(world, ld, S3_DIRECTORY, seed=1)
    assert world.complete("resumed") == seed_text(1)
    after = s3_counts(world, prefix)
    for name in verified:
        assert after[name] == before[name] + 1, f"{name} was verified before the kill: fetched once"
    assert after["model.safetensors"] == before["model.safetensors"] + 2, "the rest asked for once more"
    done = [p for p in world.pods("resumed", FETCH_PODS) if p["status"].get("phase") == "Succeeded"]
    assert [p["metadata"]["uid"] for p in done] != [killed["metadata"]["uid"]] and len(done) == 1, done
    print(f"resumed: its fetch pod was deleted with {sorted(verified)} verified")
    # Left to the module's teardown, which deletes its pod without the preStop drain's wait.
