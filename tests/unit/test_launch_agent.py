"""The launch agent a multi-node leader's mpirun starts its workers' daemons through (no sshd in
NVIDIA's image): the operator's identities, the real agent over real TLS in separate processes as
the pods run it, and Open MPI's own mpirun launching an orted through it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from llm_operator import contract
from llm_operator.controller.secrets.launch import identities
from llm_operator.runtime import launch_agent
from llm_operator.runtime.processes import stale_launches

from tests.unit.launch_identities import OPERATOR, free_port, role_dirs, wait_listening


class Group:
    def __init__(self, root: Path) -> None:
        self.leader, self.worker = role_dirs(root)
        self.port = free_port()
        self.server: subprocess.Popen[str] | None = None

    def env(self, identity: Path, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(OPERATOR), "LLMOP_LAUNCH_IDENTITY_DIR": str(identity),
                "LLMOP_LAUNCH_PORT": str(self.port), **extra}  # fmt: skip

    def serve(self) -> subprocess.Popen[str]:
        self.server = subprocess.Popen(
            [sys.executable, "-m", "llm_operator.runtime.launch_agent", "--serve"],
            env=self.env(self.worker, WORKER_ONLY="the worker's own"),
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_listening(self.port)
        return self.server

    def launch(
        self, *words: str, identity: Path | None = None, host: str = "127.0.0.1"
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "llm_operator.runtime.launch_agent", host, *words],
            env=self.env(identity or self.leader, WORKER_ONLY="the leader's"),
            capture_output=True,
            text=True,
            timeout=30,
        )

    def stop(self) -> str:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        _, err = self.server.communicate(timeout=20)
        return err


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    yield g
    if g.server is not None and g.server.poll() is None:
        g.server.kill()
        g.server.wait()


def test_each_side_is_a_self_signed_p256_certificate_for_its_role() -> None:
    files = identities(datetime.now(UTC))
    assert set(files) == {
        contract.LEADER_CERT,
        contract.LEADER_KEY,
        contract.WORKER_CERT,
        contract.WORKER_KEY,
    }
    for cert_file, usage in ((contract.LEADER_CERT, ExtendedKeyUsageOID.CLIENT_AUTH),
                             (contract.WORKER_CERT, ExtendedKeyUsageOID.SERVER_AUTH)):  # fmt: skip
        cert = x509.load_pem_x509_certificate(files[cert_file].encode())
        assert cert.issuer == cert.subject
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
        assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [usage]
    # Two calls, two identities: nothing is shared between deployments.
    assert identities(datetime.now(UTC))[contract.LEADER_KEY] != files[contract.LEADER_KEY]


def test_a_command_runs_in_the_workers_environment_with_its_output_and_status(group: Group) -> None:
    group.serve()
    # As ssh does, the words are joined with spaces for the worker's shell.
    done = group.launch("echo", "'two  spaces'", ";", "echo", "$WORKER_ONLY", ">&2", ";", "exit", "7")
    assert (done.returncode, done.stdout, done.stderr) == (7, "two  spaces\n", "the worker's own\n")
    assert group.launch("kill", "-9", "$$").returncode == 128 + 9
    err = group.stop()
    assert "a launch from 127.0.0.1: echo 'two  spaces'" in err


def test_only_this_deployments_leader_launches_and_only_on_its_own_workers(
    group: Group, tmp_path: Path
) -> None:
    group.serve()
    other_leader, other_worker = role_dirs(tmp_path / "other")
    refused = group.launch("touch", str(tmp_path / "ran"), identity=other_leader)
    assert refused.returncode == launch_agent.EXIT_UNREACHED
    assert refused.stderr.startswith(f"{launch_agent.PROGRAM}: 127.0.0.1:{group.port}: ")
    assert not (tmp_path / "ran").exists()
    # The other deployment's leader trusts its own workers only: this worker is not one.
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in (contract.LEADER_CERT, contract.LEADER_KEY):
        shutil.copy(group.leader / name, mixed / name)
    shutil.copy(other_worker / contract.WORKER_CERT, mixed / contract.WORKER_CERT)
    unproven = group.launch("touch", str(tmp_path / "ran"), identity=mixed)
    assert unproven.returncode == launch_agent.EXIT_UNREACHED
    assert "did not prove it is one of this deployment's workers" in unproven.stderr
    assert not (tmp_path / "ran").exists()
    assert group.launch("true").returncode == 0


def test_nothing_listening_and_an_unknown_name_are_said_in_one_line(group: Group) -> None:
    refused = group.launch("true")
    assert refused.returncode == launch_agent.EXIT_UNREACHED
    assert "connection refused (no launch agent listening" in refused.stderr
    unknown = group.launch("true", host="worker.invalid")
    assert unknown.returncode == launch_agent.EXIT_UNREACHED and "does not resolve" in unknown.stderr


def test_a_launch_runs_only_on_the_pod_its_leader_meant(group: Group, tmp_path: Path) -> None:
    """Every leader of a deployment holds the same identity: the name the leader used must be this
    pod's (its host name; the pods' DNS names start with it), or a stale record or a reused address
    would start one group's world on another group's worker."""
    group.serve()
    me = socket.gethostname()
    assert me != "localhost" and socket.gethostbyname(me).startswith("127.")
    assert group.launch("true", host=me).returncode == 0
    wrong = group.launch("touch", str(tmp_path / "ran"), host="localhost")
    assert wrong.returncode == launch_agent.EXIT_UNREACHED and not (tmp_path / "ran").exists()
    why = f"reached {me}, not localhost (a stale DNS record, or an address another pod has now): nothing run"
    assert wrong.stderr == f"{launch_agent.PROGRAM}: localhost:{group.port}: {why}\n"
    assert f"refused a launch from 127.0.0.1: reached {me}, not localhost" in group.stop()


@pytest.mark.parametrize(
    ("host", "pod", "refused"),
    [("w-g0-1.w-pods.ns.svc", "w-g0-1", False), ("w-g1-1.w-pods.ns.svc", "w-g0-1", True),
     ("w-g0-1", "w-g0-1", False), ("10.1.2.3", "w-g0-1", False), ("[fd00::1]", "w-g0-1", False)],
)  # fmt: skip
def test_the_name_a_leader_meant_is_matched_by_its_first_label(host: str, pod: str, refused: bool) -> None:
    assert (launch_agent.not_this_pod(host, pod) is not None) == refused


def test_probes_and_strangers_cost_a_slot_for_a_moment_and_never_end_the_agent(
    group: Group, tmp_path: Path
) -> None:
    """The leader's wait for its workers connects and closes (not logged); a peer without the
    identity is refused and logged; more idle connections than the agent's slots are closed unread,
    and once they go the leader launches as before."""
    server = group.serve()
    with socket.create_connection(("127.0.0.1", group.port)):
        pass
    stranger, _ = role_dirs(tmp_path / "other")
    assert group.launch("true", identity=stranger).returncode == launch_agent.EXIT_UNREACHED
    idle = [
        socket.create_connection(("127.0.0.1", group.port)) for _ in range(launch_agent.MAX_CONNECTIONS + 8)
    ]
    time.sleep(0.5)
    assert server.poll() is None
    for s in idle:
        s.close()
    time.sleep(0.5)
    assert group.launch("true").returncode == 0
    err = group.stop()
    assert err.count("refused a connection from 127.0.0.1") == 1, err
    assert "ended" not in err.replace("ended with status", ""), err


def test_a_leader_that_hangs_up_ends_its_command_on_the_worker(group: Group, tmp_path: Path) -> None:
    group.serve()
    pid_file = tmp_path / "pid"
    client = subprocess.Popen(
        [sys.executable, "-m", "llm_operator.runtime.launch_agent", "127.0.0.1",
         f"sleep 60 & echo $! > {pid_file}; wait"],
        env=group.env(group.leader),
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    sleeper = int(pid_file.read_text())
    client.kill()  # as mpirun SIGKILLs a launch agent still running when it aborts
    client.wait()
    deadline = time.monotonic() + 10
    while _alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(sleeper)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_closes_to_new_launches_and_lets_a_running_one_finish(group: Group) -> None:
    group.serve()
    running = subprocess.Popen(
        [sys.executable, "-m", "llm_operator.runtime.launch_agent", "127.0.0.1", "sleep 1; echo done"],
        env=group.env(group.leader), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.5)
    assert group.server is not None
    group.server.send_signal(signal.SIGTERM)
    time.sleep(0.7)  # the listener closes within its 0.5 s accept timeout
    assert "connection refused" in group.launch("true").stderr
    out, _ = running.communicate(timeout=20)
    assert (running.returncode, out) == (0, "done\n")
    assert group.server.wait(timeout=20) == 0


def test_a_session_left_under_the_launcher_is_not_taken_for_a_launch() -> None:
    """A session's shell reparented to the launcher (its agent gone) is no launch to end."""
    table = {
        10: (1, ["orted", "-mca"]),
        11: (1, ["orted", "-mca"]),
        12: (1, [launch_agent.SESSION_TITLE, "-c", "x"]),
    }
    started = {10: 5, 11: 9, 12: 1}
    assert stale_launches(table, 1, 2, started.__getitem__) == [10]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_open_mpis_mpirun_starts_a_remote_daemon_through_the_agent(group: Group) -> None:
    """mpirun takes 127.0.0.2 for another node (not an address of this host's interfaces) and starts
    its orted there through the agent, as a leader starts its workers'; the rank on that node then
    runs in the worker's environment."""
    group.serve()
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    agent = f"{sys.executable} -m llm_operator.runtime.launch_agent"
    done = subprocess.run(
        [mpirun, "--allow-run-as-root", "--oversubscribe", "--host", "localhost:1,127.0.0.2:1", "--prefix",
         str(Path(os.path.realpath(mpirun)).parent.parent), "--mca", "plm_rsh_agent", agent,
         "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
         "-n", "2", "sh", "-c", 'echo "rank $OMPI_COMM_WORLD_RANK: ${WORKER_ONLY:-none}"'],
        env=group.env(group.leader, WORKER_ONLY="the leader's"),
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(done.stdout.splitlines()) == ["rank 0: the leader's", "rank 1: the worker's own"]
    assert "a launch from 127.0.0.1:" in group.stop()
