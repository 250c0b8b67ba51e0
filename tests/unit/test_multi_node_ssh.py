"""The SSH identity of multi-node groups: the key pairs the operator makes, what each role copies
from them, and the real OpenSSH sshd and ssh with the configuration and keys the launcher writes,
run as a non-root user holding the keys through a group as a pod's fsGroup gives them.

What the review asked for: workers never hold the client key nor leaders the host key, the leader
pins the workers' host key, sshd forwards nothing, and no value of the environment is in a file
other than the 0400 one a session reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from llm_operator import contract
from llm_operator.controller.secrets.ssh import key_pair
from llm_operator.runtime import launcher, supervisor
from llm_operator.runtime.commands import rsh_args, worker_command
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.ssh import ENVIRONMENT_FILE, environment_file, sshd_config

from e2e.cluster.processes import free_port

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
SECRET_VALUE = "hf_n0t-a-real-token"  # stands for an HF token in the worker container's env
MULTI = {"LLMOP_TP": "2", "LLMOP_PP": "1", "LLMOP_GPUS_PER_POD": "1", "LLMOP_PODS_PER_REPLICA": "2",
         "LLMOP_WORKER_HOST_PATTERN": "127.0.0.{worker}"}  # fmt: skip
FS_GROUP = 4242  # a group only the "pod" user has, as the kubelet's fsGroup


def test_the_key_pairs_are_openssh_pairs_and_the_client_key_is_restricted() -> None:
    data = key_pair()
    client = serialization.load_ssh_private_key(data[contract.SSH_PRIVATE_KEY].encode(), password=None)
    options, key_type, key, comment = data[contract.SSH_AUTHORIZED_KEYS].split()
    assert options == "restrict" and comment == "llm-operator"
    assert client.public_key() == serialization.load_ssh_public_key(f"{key_type} {key}".encode())
    host = serialization.load_ssh_private_key(data[contract.SSH_HOST_KEY].encode(), password=None)
    alias, key_type, key = data[contract.SSH_KNOWN_HOSTS].split()
    assert alias == contract.SSH_HOST_ALIAS
    assert host.public_key() == serialization.load_ssh_public_key(f"{key_type} {key}".encode())
    assert key_pair()[contract.SSH_HOST_KEY] != data[contract.SSH_HOST_KEY], "fresh per deployment"


def test_sshd_config_carries_no_value_of_the_environment() -> None:
    c = PodConfig.from_env({"LLMOP_MODEL_REPO": "/repo", **MULTI, "LLMOP_ROLE": "worker"})
    text = sshd_config(c, host_key="/run/hk", authorized_keys="/run/ak", environment="/run/env")
    assert "Port 2222\n" in text and "HostKey /run/hk\n" in text and "AuthorizedKeysFile /run/ak\n" in text
    assert "DisableForwarding yes\n" in text and "PermitUserEnvironment no\n" in text
    assert "SetEnv" not in text and "AcceptEnv" not in text


def test_the_environment_file_survives_any_value_through_a_posix_shell(tmp_path: Path) -> None:
    environ = {"PATH": os.environ["PATH"], "Q": "it's \"quoted\" $HOME `x` \\ a\nb", "E": "", "HOME": "/x",
               "not-a-name": "skipped"}  # fmt: skip
    (tmp_path / "env").write_text(environment_file(environ))
    out = subprocess.run(["/bin/sh", "-c", f'. {tmp_path}/env && printf %s "$Q|$E|$HOME"'],
                         env={"HOME": "/session"}, capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout == f"{environ['Q']}||/session", "values verbatim; the session's own HOME kept"


# --- the real OpenSSH ------------------------------------------------------------------------


def pod_user() -> pwd.struct_passwd:
    """A non-root user with a login shell (sshd runs a session's command through it)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    for user in pwd.getpwall():
        if (
            user.pw_uid >= 1000
            and user.pw_uid != 65534
            and Path(user.pw_shell).name in ("sh", "bash", "dash")
        ):
            return user
    pytest.skip("no non-root user with a shell to run sshd as")


# The launcher's preparation, run as the pod's user: the runtime needs only the standard library.
PREPARE = """
import json, sys
from llm_operator.runtime.config import PodConfig
from llm_operator.runtime.ssh import prepare_client, prepare_sshd
c = PodConfig.from_env(json.loads(sys.argv[1]))
print(prepare_sshd(c, json.loads(sys.argv[2])) if c.role == "worker" else prepare_client(c))
"""


@dataclasses.dataclass
class Group:
    """A worker and a leader as the launcher prepares them, from Secret volumes laid out as the
    kubelet does with an fsGroup (files of root's, 0440, group FS_GROUP), as a non-root user."""

    user: pwd.struct_passwd
    base: Path
    port: int

    def as_user(self) -> dict[str, object]:
        env = {"PATH": os.environ["PATH"], "HOME": str(self.base), "PYTHONPATH": str(OPERATOR)}
        if os.geteuid() != 0:
            return {"env": env}
        return {"env": env, "user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": [FS_GROUP]}

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, **self.as_user())  # type: ignore[call-overload, no-any-return]

    def pod(
        self, role: str, keys: dict[str, str], environ: dict[str, str] | None = None
    ) -> tuple[PodConfig, str]:
        """A pod of `role` with its half of `keys` mounted: its config and what preparing returned."""
        volume = self.base / f"{role}-secret"
        shutil.rmtree(volume, ignore_errors=True)
        shutil.rmtree(self.base / f"{role}-run", ignore_errors=True)
        volume.mkdir(mode=0o755)
        for name in contract.WORKER_SSH_KEYS if role == "worker" else contract.LEADER_SSH_KEYS:
            (volume / name).write_text(keys[name])
            (volume / name).chmod(0o440)
            if os.geteuid() == 0:
                os.chown(volume / name, 0, FS_GROUP)
        env = {"LLMOP_MODEL_REPO": "/repo", **MULTI, "LLMOP_ROLE": role, "LLMOP_SSH_PORT": str(self.port),
               "LLMOP_SSH_DIR": str(volume), "LLMOP_RUNTIME_DIR": str(self.base / f"{role}-run")}  # fmt: skip
        out = self.run(["/usr/bin/python3", "-c", PREPARE, json.dumps(env), json.dumps(environ or {})])
        assert out.returncode == 0, out.stderr
        return PodConfig.from_env(env), out.stdout.strip()

    def ssh(
        self, leader: PodConfig, *options: str, command: str = "true"
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["ssh", *rsh_args(leader).split(), *options, "127.0.0.1", command])


@pytest.fixture
def group() -> Iterator[Group]:
    user = pod_user()
    base = Path(tempfile.mkdtemp(prefix="llmop-ssh-"))
    base.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(base, user.pw_uid, user.pw_gid)
    try:
        yield Group(user, base, free_port())
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(
    not Path("/usr/sbin/sshd").exists() or not shutil.which("ssh"), reason="OpenSSH is not installed"
)
# The pod user runs the stdlib-only runtime with the system interpreter (it cannot enter root's venv).
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system python3")
def test_real_sshd_lets_only_the_pinned_leader_in_forwards_nothing_and_keeps_the_environment_private(
    group: Group,
) -> None:
    keys = key_pair()
    environ = {"PATH": os.environ["PATH"], "LLMOP_PROBE": "from the worker pod", "HF_TOKEN": SECRET_VALUE}
    worker, config_file = group.pod("worker", keys, environ)
    leader, _ = group.pod("leader", keys)
    run = {role: Path(c.runtime_dir) for role, c in (("worker", worker), ("leader", leader))}
    # Each role holds only its half, copied to 0400 files of the pod user's in a 0700 directory.
    assert sorted(p.name for p in run["leader"].iterdir()) == sorted(contract.LEADER_SSH_KEYS)
    assert set(contract.WORKER_SSH_KEYS) <= {p.name for p in run["worker"].iterdir()}
    assert contract.SSH_PRIVATE_KEY not in {p.name for p in run["worker"].iterdir()}
    for directory in run.values():
        assert directory.stat().st_mode & 0o777 == 0o700 and directory.stat().st_uid == group.user.pw_uid
        assert all(f.stat().st_mode & 0o777 == 0o400 for f in directory.iterdir())
    # The value is in the session's environment file only: not in the config, nor on a command line.
    for f in run["worker"].iterdir():
        assert (SECRET_VALUE in f.read_text()) == (f.name == ENVIRONMENT_FILE), f.name

    sshd = subprocess.Popen(worker_command(worker, config_file), stderr=subprocess.PIPE, **group.as_user())  # type: ignore[call-overload]
    try:
        pending = launcher.wait_for_workers(["127.0.0.1"], worker.ssh_port, 10, supervisor.Stop())
        assert pending == {}, sshd.stderr.read().decode() if sshd.poll() is not None and sshd.stderr else ""
        assert SECRET_VALUE not in Path(f"/proc/{sshd.pid}/cmdline").read_text()

        # The leader logs in, and the session runs with the worker container's environment.
        out = group.ssh(leader, command='echo "$LLMOP_PROBE|$HF_TOKEN"')
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"from the worker pod|{SECRET_VALUE}"

        # Forwarding of any kind is refused: a TCP stream through the worker, a remote listener,
        # the leader's agent.
        out = group.ssh(leader, "-W", f"127.0.0.1:{worker.ssh_port}")
        assert out.returncode == 255 and "stdio forwarding failed" in out.stderr, out.stderr
        out = group.ssh(leader, "-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:9")
        assert out.returncode == 255 and "forwarding failed" in out.stderr, out.stderr
        agent = group.base / "agent.sock"
        started = group.run(["ssh-agent", "-a", str(agent)])
        assert started.returncode == 0, started.stderr
        pid = int(started.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
        try:
            out = group.ssh(
                leader, "-A", "-o", f"IdentityAgent={agent}", command='echo "${SSH_AUTH_SOCK:-none}"'
            )
            assert out.returncode == 0 and out.stdout.strip() == "none", out.stderr
        finally:
            os.kill(pid, signal.SIGTERM)

        # A host that does not hold the workers' host key is refused: the key, not the name, counts.
        impostor = {**keys, contract.SSH_KNOWN_HOSTS: key_pair()[contract.SSH_KNOWN_HOSTS]}
        stranger, _ = group.pod("leader", impostor)
        out = group.ssh(stranger)
        assert out.returncode == 255 and "Host key verification failed" in out.stderr, out.stderr
        # Nor does a client key other than the deployment's get in.
        other = {**keys, contract.SSH_PRIVATE_KEY: key_pair()[contract.SSH_PRIVATE_KEY]}
        intruder, _ = group.pod("leader", other)
        out = group.ssh(intruder)
        assert out.returncode == 255 and "Permission denied" in out.stderr, out.stderr
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
