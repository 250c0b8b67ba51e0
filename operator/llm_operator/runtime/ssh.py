"""The launcher's side of a multi-node group's SSH identity (the Secret at LLMOP_SSH_DIR, made by
controller/ssh.py): a leader's mpirun logs in with the private key, a worker's unprivileged sshd
accepts the public one.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from llm_operator.contract import SSH_PRIVATE_KEY, SSH_PUBLIC_KEY
from llm_operator.runtime.config import PodConfig

# Variables sshd (or a shell) sets for each session itself.
_SESSION_ENV = {"HOME", "PWD", "OLDPWD", "SHLVL", "_", "USER", "LOGNAME", "SHELL", "TERM", "MAIL"}


def sshd_config(c: PodConfig, *, host_key: str, authorized_keys: str, environ: Mapping[str, str]) -> str:
    """sshd for a worker pod. It runs as the container's user (non-root sshd skips privilege
    separation, which needs capabilities the pod drops), and hands ranks the worker's own
    container environment (CUDA, NCCL, library paths) instead of sshd's minimal one."""
    lines = [
        f"Port {c.ssh_port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {c.runtime_dir}/sshd.pid",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",  # Secret and emptyDir modes are not OpenSSH's
        "AllowTcpForwarding no",
        "X11Forwarding no",
        "PrintMotd no",
    ]
    env = [
        f'{k}="{v}"'
        for k, v in sorted(environ.items())
        if k not in _SESSION_ENV
        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
        and not re.search(r'["\\\n]', v)
    ]
    if env:
        lines.append("SetEnv " + " ".join(env))
    return "\n".join(lines) + "\n"


def prepare_client_key(c: PodConfig) -> str:
    """A private copy of the Secret's key: ssh refuses keys other users can read."""
    Path(c.runtime_dir).mkdir(parents=True, exist_ok=True)
    key = Path(c.runtime_dir) / SSH_PRIVATE_KEY
    key.write_bytes((Path(c.ssh_dir) / SSH_PRIVATE_KEY).read_bytes())
    key.chmod(0o600)
    return str(key)


def prepare_sshd(c: PodConfig, environ: Mapping[str, str]) -> str:
    """Host key (fresh per start), authorized key from the Secret, config; returns the config path."""
    run = Path(c.runtime_dir)
    run.mkdir(parents=True, exist_ok=True)
    host_key = run / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    authorized = run / "authorized_keys"
    authorized.write_bytes((Path(c.ssh_dir) / SSH_PUBLIC_KEY).read_bytes())
    config = run / "sshd_config"
    config.write_text(
        sshd_config(c, host_key=str(host_key), authorized_keys=str(authorized), environ=environ)
    )
    return str(config)
