"""Kubeconfigs of the embedded cluster (the admin one for people and tests, one per component) and
the `env` file that points a shell at it."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from e2e.cluster.pki import Pki, write_private

CLUSTER_NAME = "llmop-e2e"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write(path: Path, port: int, pki: Pki, client: str, host: str = "127.0.0.1") -> None:
    """A kubeconfig for the apiserver on `host`:`port`, authenticated as pki.clients[client]."""
    pair = pki.clients[client]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {
                    "server": f"https://{host}:{port}",
                    "certificate-authority-data": _b64(pki.ca.cert),
                },
            }
        ],
        "users": [
            {
                "name": client,
                "user": {"client-certificate-data": _b64(pair.cert), "client-key-data": _b64(pair.key)},
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": client}}],
        "current-context": CLUSTER_NAME,
    }
    write_private(path, yaml.safe_dump(config, sort_keys=False))


def write_env(path: Path, kubeconfig: Path, bin_dir: Path) -> None:
    """`source`-able: KUBECONFIG and PATH for kubectl and helm."""
    path.write_text(f'export KUBECONFIG="{kubeconfig}"\nexport PATH="{bin_dir}:$PATH"\n')
