"""Embedded Kubernetes control plane for the e2e tests: real etcd, kube-apiserver,
kube-controller-manager and kube-scheduler on 127.0.0.1, with GPU node pools simulated by kwok.

CLI: `python -m e2e.cluster up|down|status` (make cluster-up / cluster-down). Python:
`Cluster().up()`, `Cluster().kubeconfig`, `Cluster().down()`. Details: docs/development.md.
"""

from e2e.cluster.launcher import Cluster, UpReport
from e2e.cluster.readiness import ClusterError
from e2e.cluster.state import DEFAULT_STATE_DIR

__all__ = ["DEFAULT_STATE_DIR", "Cluster", "ClusterError", "UpReport"]
