"""The test world's OCI registry: CNCF Distribution (build-tools.sh), inside the cluster's network
namespace on NODE_IP:PORT, TLS from the cluster CA, htpasswd (bcrypt) authentication.

`up` pushes every image the real node runs to it with crane (images.push; only what changed), and
the node's containerd pulls from it (node.py writes containerd's registry host configuration):

- names with the registry's own host (`10.240.0.10:5000/llm-operator/cpu-runtime:...`) pull as
  from any private registry: the pod's imagePullSecret, nothing configured on the node;
- the operator's and the chart's default names (`ghcr.io/llm-operator/llm-operator/*`, `registry.k8s.io/...`,
  `docker.io/...`) and images.builder's `localhost/llm-operator/*` mirror to it, with the node's
  own credentials in the mirror's hosts.toml (an Authorization header): a pod naming a default
  image has no pull secret, and containerd 1.6 has no other per-mirror credential (docs/development.md,
  "The registry", has the upstream references).

Blobs live in the node cache (kept across `down`, like containerd's root), so a warm `up` pushes
nothing and pulls nothing.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from e2e.cluster import containerd_images, netns
from e2e.cluster import pki as pki_mod
from e2e.cluster.state import StateDir
from images.push import Crane, manifest_digest, project_version, push

COMPONENTS = ("registry",)
BINARIES = ("registry", "crane")
PORT = 5000
HOST = f"{netns.NODE_IP}:{PORT}"
REALM = "llm-operator test world"
BUILDER_PREFIX = "localhost/llm-operator/"  # images.builder's names (they keep their path here)
DEFAULT_PREFIX = (
    "ghcr.io/llm-operator/llm-operator"  # the operator's and the chart's (images.py, values.yaml)
)
# Where the default names resolve through the mirror, so where a release to the test world goes.
PREFIX = f"{HOST}/{DEFAULT_PREFIX.partition('/')[2]}"
# Test-world accounts (nothing outside the namespace reaches the registry): `push` for crane and
# helm, and the pull secrets tests create; `node` for the mirrors' hosts.toml. Their passwords are
# new at each `up` (Passwords).
PUSH_USER, NODE_USER = "push", "node"
PASSWORDS = "passwords.json"  # in the registry's root (the state dir), readable by its owner only
# Registry hosts whose names mirror to the test registry -> their upstream server, as containerd's
# hosts.toml names it (docker.io's API is registry-1.docker.io). images.builder's localhost names
# have no upstream: their server is containerd's default for localhost (plain HTTP on port 80,
# nothing listens there in the namespace).
MIRRORED = {
    "ghcr.io": "https://ghcr.io",
    "registry.k8s.io": "https://registry.k8s.io",
    "docker.io": "https://registry-1.docker.io",
    "localhost": "http://localhost",
}


@dataclass(frozen=True)
class Passwords:
    """The accounts' passwords, made by `up` as the model stores' keys are (artifacts.new)."""

    push: str
    node: str


def new_passwords(root: Path) -> Passwords:
    passwords = Passwords(secrets.token_urlsafe(18), secrets.token_urlsafe(18))
    path = root / PASSWORDS
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        json.dump(asdict(passwords), f)
    return passwords


def passwords(root: Path) -> Passwords:
    """The passwords of the cluster whose registry root is `root`."""
    return Passwords(**json.loads((root / PASSWORDS).read_text()))


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def dockerconfigjson(user: str, password: str, host: str = HOST) -> str:
    """A kubernetes.io/dockerconfigjson Secret's `.dockerconfigjson` (and crane's and helm's
    config.json) for `host`."""
    return json.dumps(
        {"auths": {host: {"username": user, "password": password, "auth": basic(user, password)}}}
    )


def htpasswd(path: Path, passwords: Passwords) -> None:
    """bcrypt entries (Distribution's htpasswd accepts only bcrypt), by Debian's apache2-utils; the
    password on its stdin (-i), not in its arguments."""
    lines = []
    for user, password in ((PUSH_USER, passwords.push), (NODE_USER, passwords.node)):
        out = subprocess.run(
            ["htpasswd", "-niB", "-C", "6", user], input=password, capture_output=True, text=True, check=True
        ).stdout
        lines.append(out.strip())
    path.write_text("\n".join(lines) + "\n")


def config(root: Path, storage: Path, tls: pki_mod.KeyPair) -> dict[str, object]:
    """Distribution's configuration (docs/content/about/configuration.md of v3.1.2)."""
    return {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {
            "addr": HOST,
            "tls": {"certificate": str(tls.cert), "key": str(tls.key)},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
        "auth": {"htpasswd": {"realm": REALM, "path": str(root / "htpasswd")}},
    }


def prepare(root: Path, storage: Path, pki_dir: Path) -> list[str]:
    """Write the registry's certificate, new passwords, htpasswd and configuration under `root`
    (blobs in `storage`, which outlives `down`); returns its arguments."""
    root.mkdir(parents=True, exist_ok=True)
    storage.mkdir(parents=True, exist_ok=True)
    tls = pki_mod.issue_server_cert(pki_dir, "registry", ["registry.llmop.test"], ips=[netns.NODE_IP])
    made = new_passwords(root)
    htpasswd(root / "htpasswd", made)
    (root / "config.yml").write_text(yaml.safe_dump(config(root, storage, tls)))
    (root / "docker").mkdir(exist_ok=True)
    pki_mod.write_private(root / "docker" / "config.json", dockerconfigjson(PUSH_USER, made.push))
    return ["serve", str(root / "config.yml")]


def client_env(root: Path, ca: Path) -> dict[str, str]:
    """Environment for crane and helm talking to the registry: the push account (crane reads
    $DOCKER_CONFIG/config.json, helm $HELM_REGISTRY_CONFIG) and the cluster CA as the only roots
    (SSL_CERT_FILE, which Go reads)."""
    config = root / "docker"
    return {
        "DOCKER_CONFIG": str(config),
        "HELM_REGISTRY_CONFIG": str(config / "config.json"),
        "SSL_CERT_FILE": str(ca),
    }


def ready(ns: str) -> bool:
    """The registry answers /v2/ with 401 and its realm (TLS not verified: only liveness)."""
    import http.client
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    sock = netns.connect(ns, netns.NODE_IP, PORT)
    conn = http.client.HTTPSConnection(netns.NODE_IP, PORT, timeout=2)
    conn.sock = ctx.wrap_socket(sock)
    try:
        conn.request("GET", "/v2/")
        resp = conn.getresponse()
        return resp.status == 401 and REALM in resp.getheader("WWW-Authenticate", "")
    finally:
        conn.close()


def hosts_toml(server: str, ca: Path, header: Mapping[str, str] | None = None) -> str:
    """containerd's hosts.toml (docs/hosts.md of containerd 1.6): pull and resolve from the test
    registry, trusting the cluster CA; `header` on each request to it."""
    lines = [f"server = {json.dumps(server)}", "", f'[host."https://{HOST}"]']
    lines += ['  capabilities = ["pull", "resolve"]', f"  ca = {json.dumps(str(ca))}"]
    if header:
        lines.append(f'  [host."https://{HOST}".header]')
        lines += [f"    {k} = {json.dumps(v)}" for k, v in header.items()]
    return "\n".join(lines) + "\n"


def write_hosts(certs_d: Path, ca: Path, node_password: str) -> None:
    """containerd's config_path: the registry's own host (its CA only: credentials come from the
    pod's pull secret) and the mirrored defaults (with the node's credentials)."""
    node_auth = {"Authorization": f"Basic {basic(NODE_USER, node_password)}"}
    # containerd 1.6.20 refuses a hosts.toml without a [host] table ("invalid `host` tree",
    # remotes/docker/config/hosts.go getSortedHosts) and then pulls without the CA: the registry's
    # own host names itself as its one host.
    files = {HOST: hosts_toml(f"https://{HOST}", ca)}
    files |= {host: hosts_toml(server, ca, node_auth) for host, server in MIRRORED.items()}
    for host, text in files.items():
        # containerd looks a host:port up as host_port_ first, then host:port (hostDirFromRoots).
        directory = certs_d / host
        directory.mkdir(parents=True, exist_ok=True)
        pki_mod.write_private(directory / "hosts.toml", text)  # the node's Basic header


def local_name(ref: str) -> str:
    """The name `ref` (a default or images.builder name) has in the test registry: its path under
    HOST, as containerd asks the mirror for it (`ghcr.io/llm-operator/llm-operator/operator:0.1.0` ->
    `10.240.0.10:5000/llm-operator/llm-operator/operator:0.1.0`)."""
    host, _, rest = ref.partition("/")
    if host not in MIRRORED or not rest:
        raise ValueError(f"{ref} is not under a mirrored registry ({', '.join(MIRRORED)})")
    return f"{HOST}/{rest}"


def push_refs(names: Sequence[str], version: str) -> list[str]:
    """Where an archive carrying image `names` goes in the test registry: each name's mirrored
    path and, for images.builder's `localhost/llm-operator/<image>:*`, `<image>:<version>` too,
    which the operator's and the chart's default names (`ghcr.io/llm-operator/llm-operator/<image>:<version>`)
    resolve to."""
    refs = [local_name(n) for n in names]
    for n in names:
        if n.startswith(BUILDER_PREFIX) and not _named_by_default(names):
            refs.append(f"{PREFIX}/{n.removeprefix(BUILDER_PREFIX).rpartition(':')[0]}:{version}")
    return list(dict.fromkeys(refs))


def _named_by_default(names: Sequence[str]) -> bool:
    """The archive carries its default name itself (the launcher's content tag, images.builder):
    the version tag is none the operator or the chart would pull."""
    return any(n.startswith(f"{DEFAULT_PREFIX}/") for n in names)


def default_refs(names: Sequence[str], version: str) -> list[str]:
    """The operator's and the chart's default names of the images.builder image among `names`
    (`ghcr.io/llm-operator/llm-operator/<image>:<version>`): tags that move with each rebuild in
    the test world, so `up` drops the node's copy at an older digest and the kubelet pulls the new
    one."""
    if _named_by_default(names):  # content-named: a tag that never moves to other files
        return []
    images = {
        n.removeprefix(BUILDER_PREFIX).rpartition(":")[0] for n in names if n.startswith(BUILDER_PREFIX)
    }
    return [f"{DEFAULT_PREFIX}/{image}:{version}" for image in sorted(images)]


def crane(binary: Path, root: Path, ca: Path, ns: str) -> Crane:
    """crane for the test registry: inside the namespace, with the push account and the CA."""
    return Crane(binary, client_env(root, ca), lambda argv: netns.command(ns, argv))


def push_images(
    state: StateDir,
    binary: Path,
    archives: Sequence[Path],
    log: Callable[[str], None],
    version: str | None = None,
) -> list[str]:
    """Push `archives` to the test registry under every name the node and the default image names
    pull (push_refs), only those it lacks at the archive's digest; returns them."""
    client = crane(binary, state.root / "registry", pki_mod.paths(state.pki_dir).ca.cert, state.netns)
    pushed = []
    for archive in archives:
        refs = push_refs(containerd_images.image_names(archive), version or project_version())
        pushed += push(client, archive, refs, lambda line: log(f"registry: {line}"))
    return pushed


def default_names(archives: Sequence[Path], version: str | None = None) -> dict[str, str]:
    """The default names (default_refs) of `archives`' images -> their digests."""
    found = {}
    for archive in archives:
        for name in default_refs(containerd_images.image_names(archive), version or project_version()):
            found[name] = manifest_digest(archive)
    return found
