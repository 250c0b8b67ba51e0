"""build-tools.sh builds what a group needs and nothing else, once, with the next tools' modules
fetched while one compiles; the add-ons name their groups. Pure: a `go` stand-in on PATH records
what the script asks of Go, in an empty cache (the real builds run in every cluster `up`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from e2e.cluster import ClusterError, addons
from e2e.cluster.components import BUILD_TOOLS, CORE_BINARIES, binaries

FAKE_GO = r"""#!/usr/bin/env bash
# Records "<tool dir> <args>" (and a build's niceness) and does what the script relies on:
# `build -o DEST PKG...` writes the binaries, `list -m -f ... MODULE` names a module directory,
# the rest (a build without -o: KEDA's trimmed scalers compiled to check them) succeeds.
echo "$(basename "$PWD") $*" >>"$GO_CALLS"
[ "$1" != build ] || echo "$(basename "$PWD") $(nice)" >>"$GO_CALLS.nice"  # its niceness
if [ "$1" = build ] && [[ " $* " == *" -o "* ]]; then
  sleep 0.5  # a compile takes a while: the background `go list` of the next tools runs meanwhile
  shift; while [ "$1" != -o ]; do shift; done; dest=$2; shift 2
  if [[ "$dest" == */ ]]; then for p in "$@"; do : >"$dest${p##*/}"; chmod +x "$dest${p##*/}"; done
  else : >"$dest"; chmod +x "$dest"; fi
elif [ "$1" = list ] && [ "$2" = -m ]; then echo "$FAKE_MODULE"
fi
"""


def _run(tmp_path: Path, *groups: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bindir = tmp_path / "fakebin"
    bindir.mkdir(exist_ok=True)
    (bindir / "go").write_text(FAKE_GO)
    (bindir / "go").chmod(0o755)
    module = tmp_path / "module"
    (module / "config/crd/standard").mkdir(parents=True, exist_ok=True)
    (module / "config/crd/standard/gateway.yaml").write_text("kind: CustomResourceDefinition\n")
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "LLMOP_CACHE": str(tmp_path / "cache"),
        "GO_CALLS": str(calls),
        "FAKE_MODULE": str(module),
    }
    proc = subprocess.run(
        ["bash", str(BUILD_TOOLS), *groups], env=env, capture_output=True, text=True, timeout=120
    )
    return proc, calls.read_text().splitlines() if calls.exists() else []


def _built(calls: list[str]) -> list[str]:
    return [c.split()[0] for c in calls if c.split()[1] == "build"]


def test_a_group_builds_its_tools_only_and_fetches_the_next_ones_modules_meanwhile(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "monitoring")
    assert proc.returncode == 0, proc.stderr
    assert _built(calls) == ["prometheus", "prometheus-adapter"]
    # The adapter's packages are listed (so their modules downloaded) while Prometheus compiles.
    prefetch = [c for c in calls if " list -deps " in c]
    assert prefetch == ["prometheus-adapter list -deps sigs.k8s.io/prometheus-adapter/cmd/adapter"]
    build = next(c for c in calls if c.startswith("prometheus build"))
    assert "-tags remove_all_sd,enable_kubernetes_sd" in build
    assert " -gcflags=all=-dwarf=false " in build, "no DWARF from the compiler: the linker drops it"
    dirs = [Path(d) for d in proc.stdout.split()]
    assert sorted(p.name for d in dirs for p in d.iterdir() if p.name != ".complete") == [
        "prometheus",
        "prometheus-adapter",
        "promtool",
    ]
    assert "build-tools: prometheus built in" in proc.stderr


def test_a_second_run_builds_nothing_and_prints_the_same_directories(tmp_path: Path) -> None:
    first, _ = _run(tmp_path, "gateway")
    assert first.returncode == 0, first.stderr
    (tmp_path / "calls").unlink()
    again, calls = _run(tmp_path, "gateway")
    assert again.returncode == 0, again.stderr
    assert calls == []  # not even a `go list`: the cache answers
    assert again.stdout == first.stdout
    traefik = Path(again.stdout.split()[0])
    assert (traefik / "traefik").is_file()
    assert (traefik / "crds" / "gateway.yaml").is_file()  # the CRDs copied beside it once


KEDA_BUILDER = """package scaling

func buildScaler(triggerType string) (scalers.Scaler, error) {
	// TRIGGERS-START
	switch triggerType {
	case "cpu":
		return scalers.NewCPUMemoryScaler(corev1.ResourceCPU, config)
	case "kafka":
		return scalers.NewKafkaScaler(ctx, config)
	case "external-push":
		return scalers.NewExternalPushScaler(config)
	case "memory":
		return scalers.NewCPUMemoryScaler(corev1.ResourceMemory, config)
	case "prometheus":
		return scalers.NewPrometheusScaler(config)
	default:
		return nil, fmt.Errorf("no scaler found for type: %s", triggerType)
	}
	// TRIGGERS-END
}
"""


def test_keda_builds_two_binaries_from_one_wrapper_module_at_low_priority(tmp_path: Path) -> None:
    """The operator and the metrics API server share tools/keda (one go.sum, one set of module
    downloads) and one copy of KEDA trimmed to the scalers the operator renders, build at
    `nice -n 10` and get KEDA's install manifests beside them."""
    module = tmp_path / "module"
    (module / "config/minimal").mkdir(parents=True)
    (module / "config/minimal/kustomization.yaml").write_text("resources: []\n")
    (module / "pkg/scaling").mkdir(parents=True)
    (module / "pkg/scaling/scalers_builder.go").write_text(KEDA_BUILDER)
    (module / "pkg/scalers").mkdir(parents=True)
    for name, constructor in [("prometheus", "NewPrometheusScaler"), ("cpu_memory", "NewCPUMemoryScaler"),
                              ("kafka", "NewKafkaScaler"),
                              ("external", "NewExternalPushScaler")]:  # fmt: skip
        go = f"package scalers\n\nfunc {constructor}() {{}}\n"
        (module / f"pkg/scalers/{name}_scaler.go").write_text(go)
    proc, calls = _run(tmp_path, "keda")
    assert proc.returncode == 0, proc.stderr
    builds = [c for c in calls if c.split()[1] == "build" and " -o " in c]
    assert [(c.split()[0], c.split()[-1]) for c in builds] == [
        ("keda", "github.com/kedacore/keda/v2/cmd/operator"),
        ("keda", "github.com/kedacore/keda/v2/cmd/adapter"),
    ]
    operator, adapter = (Path(d) for d in proc.stdout.split())
    # Each from its own trimmed copy: the scalers package checked, then the binary built from it.
    for binary, built in zip((operator, adapter), builds, strict=True):
        modfile = binary / "src/go.mod"
        assert f"-modfile {modfile} " in built
        assert f"replace github.com/kedacore/keda/v2 => {binary / 'src/keda'}" in modfile.read_text()
        scalers = sorted(p.name for p in (binary / "src/keda/pkg/scalers").iterdir())
        assert scalers == ["cpu_memory_scaler.go", "external_scaler.go", "prometheus_scaler.go"]
        assert f"keda build -trimpath -modfile {modfile} " in "\n".join(calls)
    assert (operator / "keda-operator").is_file() and (adapter / "keda-adapter").is_file()
    assert (operator / "config/minimal/kustomization.yaml").is_file()
    assert binaries(["keda"]) == ("keda-operator", "keda-adapter")
    ours = int(subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout)
    niceness = (tmp_path / "calls.nice").read_text().split()
    assert niceness == ["keda", str(min(ours + 10, 19))] * 4, "the scalers' check and the build, each"


def test_lws_builds_its_manager_alone_at_low_priority_with_its_manifests_and_version(tmp_path: Path) -> None:
    """LWS's manager (cmd/main.go) from tools/lws, at `nice -n 10`, with the version ldflags
    upstream's Makefile sets and LWS's install manifests beside it."""
    (tmp_path / "module/config/default").mkdir(parents=True)
    (tmp_path / "module/config/default/kustomization.yaml").write_text("resources: []\n")
    proc, calls = _run(tmp_path, "lws")
    assert proc.returncode == 0, proc.stderr
    (build,) = [c for c in calls if c.split()[1] == "build"]
    assert build.startswith("lws build ") and build.endswith(" sigs.k8s.io/lws/cmd")
    assert "-X sigs.k8s.io/lws/pkg/version.GitVersion=v0.9.0" in build
    assert "-X sigs.k8s.io/lws/pkg/version.GitCommit=f056f611ae7721f9983ac35f26bfbae8547fd9f3" in build
    (manager,) = (Path(d) for d in proc.stdout.split())
    assert (manager / "lws-manager").is_file()
    assert (manager / "config/default/kustomization.yaml").is_file()
    assert binaries(["lws"]) == ("lws-manager",)
    ours = int(subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout)
    assert (tmp_path / "calls.nice").read_text().split() == ["lws", str(min(ours + 10, 19))]


def test_two_callers_at_once_both_get_the_whole_manifests(tmp_path: Path) -> None:
    """`make test`'s background LWS build and the LWS fixture's own call run at once on a cold
    machine: the second waits for the first's build, then both find the manifests not yet copied.
    Each copies into its own directory and one wins, instead of one deleting the tree the other
    is copying into (a cold `make test` failed so: rm: cannot remove ...: Directory not empty)."""
    for i in range(300):  # enough files that the two copies overlap
        (tmp_path / f"module/config/part{i % 10}").mkdir(parents=True, exist_ok=True)
        (tmp_path / f"module/config/part{i % 10}/file{i}.yaml").write_text("kind: Thing\n" * 50)
    _run(tmp_path, "core")  # the fake module and cache in place; LWS not built yet
    env = {**os.environ, "PATH": f"{tmp_path / 'fakebin'}:{os.environ['PATH']}",
           "LLMOP_CACHE": str(tmp_path / "cache"), "GO_CALLS": str(tmp_path / "calls"),
           "FAKE_MODULE": str(tmp_path / "module")}  # fmt: skip
    callers = [subprocess.Popen(["bash", str(BUILD_TOOLS), "lws"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    done = [c.communicate(timeout=120) for c in callers]
    assert [c.returncode for c in callers] == [0, 0], [err for _, err in done]
    (manager,) = {out.strip() for out, _ in done}
    want = sorted(p.relative_to(tmp_path / "module") for p in (tmp_path / "module/config").rglob("*.yaml"))
    copied = sorted(p.relative_to(Path(manager)) for p in (Path(manager) / "config").rglob("*.yaml"))
    assert copied == want and (Path(manager) / "config/.complete").is_file(), len(copied)
    assert not list(Path(manager).glob(".config.*.tmp")), "the loser's copy is gone"


def test_an_unknown_group_is_refused_with_the_groups_there_are(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "monitoring", "grafana")
    assert proc.returncode == 1
    assert calls == []
    assert proc.stderr.strip() == (
        "build-tools: error: unknown group 'grafana' "
        "(groups: core monitoring gateway routing enforcer stores istio gitops crane release keda lws)"
    )


def test_every_add_on_is_a_group_and_names_binaries_its_group_provides() -> None:
    script = BUILD_TOOLS.read_text()
    for name, addon in addons.ADDONS.items():
        assert f"[{name}]=" in script, f"build-tools.sh has no group {name}"
        assert binaries([name]) == addon.binaries
    assert binaries(["core"]) == CORE_BINARIES
    assert "prometheus" not in CORE_BINARIES and "traefik" not in CORE_BINARIES


def test_unknown_add_ons_are_one_clear_error() -> None:
    with pytest.raises(ClusterError, match=r"^unknown add-on grafana \(add-ons: monitoring, gateway, "):
        addons.named(["monitoring", "grafana"])
    assert [a.name for a in addons.named(["stores", "monitoring"])] == ["monitoring", "stores"]
