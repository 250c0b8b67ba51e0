"""The launcher's side of a multi-node group's SSH identity (the Secret at LLMOP_SSH_DIR, made by
controller/secrets/ssh.py): a leader's mpirun logs in with the client key and knows its workers by their
pinned host key; a worker's unprivileged sshd holds that host key and accepts the client key.

What a pod's role needs is copied into LLMOP_RUNTIME_DIR (0700, owned by the container's user) at
0400: the Secret volume's files belong to root and are readable through the pod's fsGroup only,
which ssh and sshd would refuse for a key they own and accept from root only as root.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from llm_operator.contract import SSH_AUTHORIZED_KEYS, SSH_HOST_KEY, SSH_KNOWN_HOSTS, SSH_PRIVATE_KEY
from llm_operator.runtime.config import PodConfig

# Variables sshd (or a shell) sets for each session itself.
_SESSION_ENV = {"HOME", "PWD", "OLDPWD", "SHLVL", "_", "USER", "LOGNAME", "SHELL", "TERM", "MAIL"}
ENVIRONMENT_FILE = "environment"


def sshd_config(c: PodConfig, *, host_key: str, authorized_keys: str, environment: str) -> str:
    """sshd for a worker pod. It runs as the container's user (non-root sshd skips privilege
    separation, which needs capabilities the pod drops). Every session runs its command (the
    leader's orted) with the worker container's own environment (CUDA, NCCL, library paths, the
    user's env): read from a 0400 file at login, so no value is in this file or in sshd's
    command line."""
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
        # The key files are 0400 in a 0700 directory, but that directory is in a world-writable
        # emptyDir (/tmp), whose mode StrictModes would refuse.
        "StrictModes no",
        "DisableForwarding yes",  # TCP, agent, X11 and stream-local; the key's `restrict` too
        "PermitTunnel no",
        "PermitUserEnvironment no",
        "PrintMotd no",
        f'ForceCommand . {shlex.quote(environment)} && exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"',
    ]
    return "\n".join(lines) + "\n"


def environment_file(environ: Mapping[str, str]) -> str:
    """The worker's environment as `export NAME=value` lines a POSIX shell sources."""
    return "".join(
        f"export {k}={shlex.quote(v)}\n"
        for k, v in sorted(environ.items())
        if k not in _SESSION_ENV and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and "\0" not in v
    )


def _private_dir(c: PodConfig) -> Path:
    run = Path(c.runtime_dir)
    run.mkdir(mode=0o700, parents=True, exist_ok=True)
    run.chmod(0o700)
    return run


def _write_private(path: Path, data: bytes) -> None:
    """A 0400 file of this user's (replacing one from an earlier start of the container)."""
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_bytes(data)
    path.chmod(0o400)


def prepare_client(c: PodConfig) -> None:
    """A leader's client key and known_hosts, where commands.rsh_args expects them."""
    run = _private_dir(c)
    for name in (SSH_PRIVATE_KEY, SSH_KNOWN_HOSTS):
        _write_private(run / name, (Path(c.ssh_dir) / name).read_bytes())


def prepare_sshd(c: PodConfig, environ: Mapping[str, str]) -> str:
    """Host key and authorized key from the Secret, the environment file, the config; returns the
    config's path."""
    run = _private_dir(c)
    for name in (SSH_HOST_KEY, SSH_AUTHORIZED_KEYS):
        _write_private(run / name, (Path(c.ssh_dir) / name).read_bytes())
    environment = run / ENVIRONMENT_FILE
    _write_private(environment, environment_file(environ).encode())
    config = run / "sshd_config"
    _write_private(
        config,
        sshd_config(
            c,
            host_key=str(run / SSH_HOST_KEY),
            authorized_keys=str(run / SSH_AUTHORIZED_KEYS),
            environment=str(environment),
        ).encode(),
    )
    return str(config)
