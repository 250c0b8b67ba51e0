"""scripts/release.sh's Python steps: the chart's values pinned to the pushed digests (and the
chart rendering them), the local SLSA provenance predicate, and the images' CycloneDX SBOMs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from images import sbom as sbom_module
from images.push import REPO
from images.release import pin, provenance
from images.sbom import cached, packages, sbom
from tests.unit.test_chart import CHART, helm, needs_helm

OPERATOR, CPU, FETCH, LAUNCHER = ("sha256:" + c * 64 for c in "abcd")
VALUES = (CHART / "values.yaml").read_text()


def test_pin_fills_the_shipped_defaults_and_keeps_the_rest() -> None:
    """All but the launcher's digest: the operator names it by its content tag, which a digest of one
    build would turn into a pod template change at each rebuild."""
    pinned = pin(VALUES, {"operator": OPERATOR, "cpu-runtime": CPU, "fetch": FETCH, "launcher": LAUNCHER})
    values = yaml.safe_load(pinned)
    assert values["image"]["digest"] == OPERATOR
    assert values["image"]["digests"] == {"cpu-runtime": CPU, "fetch": FETCH}
    original = yaml.safe_load(VALUES)
    del values["image"]["digest"], values["image"]["digests"], original["image"]["digest"]
    del original["image"]["digests"]
    assert values == original
    assert pinned.count("\n") == VALUES.count("\n") + 2  # a line per digest below image; the comments stay


@needs_helm
def test_the_pinned_chart_names_every_default_image_by_digest(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"  # the packaged chart's own values: no -f in a user's install
    values.write_text(
        pin(VALUES, {"operator": OPERATOR, "cpu-runtime": CPU, "fetch": FETCH, "launcher": LAUNCHER})
    )
    docs = yaml.safe_load_all(helm("template", "rel", str(CHART), "-f", str(values)).stdout)
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    prefix = "ghcr.io/llm-operator/llm-operator"
    assert container["image"] == f"{prefix}/operator@{OPERATOR}"
    assert env["LLMOP_CPU_RUNTIME_IMAGE"] == f"{prefix}/cpu-runtime@{CPU}"
    assert env["LLMOP_FETCH_IMAGE"] == f"{prefix}/fetch@{FETCH}"
    assert env["LLMOP_LAUNCHER_IMAGE_REPOSITORY"] == f"{prefix}/launcher", "tagged by the operator"


@pytest.mark.parametrize(
    "digests",
    [{"cpu-runtime": CPU}, {"operator": "sha256:short"}, {"operator": OPERATOR.replace("sha256", "sha512")}],
)
def test_pin_refuses_what_is_not_a_release(digests: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="expected sha256 digests"):
        pin(VALUES, digests)


def test_pin_refuses_values_already_pinned() -> None:
    with pytest.raises(ValueError, match="once"):
        pin(pin(VALUES, {"operator": OPERATOR}), {"operator": OPERATOR})


def test_provenance_names_the_workflow_run_or_this_machine() -> None:
    github = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "7",
              "GITHUB_REF": "refs/tags/v0.1.0"}  # fmt: skip
    predicate = provenance("operator", OPERATOR, github, "f" * 40)
    assert predicate["runDetails"]["builder"]["id"] == "https://github.com/o/r/actions/runs/7"
    (source,) = predicate["buildDefinition"]["resolvedDependencies"]
    assert source == {"uri": "git+https://github.com/o/r", "digest": {"gitCommit": "f" * 40}}
    local = provenance("operator", OPERATOR, {}, "f" * 40)
    assert local["runDetails"]["builder"]["id"] == "local:scripts/release.sh"
    with pytest.raises(ValueError, match="not a sha256 digest"):
        provenance("operator", "latest", {}, "f" * 40)


STATUS = b"""Package: python3
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1
Description: interactive high-level object-oriented language
 (default version)

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""
METADATA = b"Metadata-Version: 2.1\nName: Jinja2\nVersion: 3.1.6\n\nlong description\n"


def test_sbom_lists_installed_debian_packages_and_python_distributions() -> None:
    files = {
        "var/lib/dpkg/status": STATUS,
        "etc/os-release": b'ID=debian\nVERSION_ID="12"\n',
        "usr/lib/python3/dist-packages/jinja2-3.1.6.dist-info/METADATA": METADATA,
    }
    assert [(p.kind, p.name, p.version) for p in packages(files)] == [
        ("deb", "python3", "3.11.2-1+b1"),
        ("pypi", "Jinja2", "3.1.6"),
    ]
    document = json.loads(sbom("operator", "0.1.0", files))
    assert (document["bomFormat"], document["specVersion"]) == ("CycloneDX", "1.6")
    assert document["metadata"]["component"]["name"] == "operator"
    assert {c["purl"] for c in document["components"]} == {
        "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=amd64&distro=debian-12",
        "pkg:pypi/jinja2@3.1.6",
    }


def test_sbom_is_read_from_the_archive_once_per_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "operator-0123.oci.tar"
    reads: list[Path] = []

    def read_files(path: Path) -> dict[str, bytes]:
        reads.append(path)
        return {}

    monkeypatch.setattr(sbom_module, "read_files", read_files)
    first = cached("operator", "0.1.0", archive)
    assert cached("operator", "0.1.0", archive) == first and reads == [archive]
    assert json.loads(cached("operator", "0.2.0", archive))["metadata"]["component"]["version"] == "0.2.0"
    assert reads == [archive, archive]


def test_sbom_of_an_image_without_packages_is_empty() -> None:
    assert json.loads(sbom("pause", "0.1.0", {})).get("components", []) == []


WORKFLOW_TEXT = (REPO / ".github" / "workflows" / "release.yml").read_text()
WORKFLOW = yaml.safe_load(WORKFLOW_TEXT)


def test_the_release_workflow_tests_read_only_then_publishes_from_a_clean_checkout() -> None:
    assert WORKFLOW[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    assert WORKFLOW["permissions"] == {}
    jobs = WORKFLOW["jobs"]
    test, publish, attesting = jobs["test"], jobs["publish"], jobs["provenance"]
    assert test["permissions"] == {"contents": "read"}
    assert [s["run"].strip() for s in test["steps"] if s.get("run", "").strip() == ".ci/run"] == [".ci/run"]
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")
    # Publishing: after the tests, its own token scopes only, runs no test code.
    assert publish["needs"] == "test" and publish["environment"] == "release"
    assert publish["permissions"] == {"packages": "write", "id-token": "write"}
    runs = "\n".join(s.get("run", "") for s in publish["steps"])
    assert not re.search(r"\.ci/run|make test|pytest", runs)
    assert '"ghcr.io/$owner/llm-operator" "$version"' in runs and "auth login ghcr.io" in runs
    assert attesting["needs"] == "publish"
    assert set(attesting["permissions"]) == {"packages", "id-token", "attestations"}
    (attest,) = [s for s in attesting["steps"] if "attest-build-provenance" in s.get("uses", "")]
    assert attest["with"]["subject-digest"] == "${{ matrix.subject.digest }}"
    for job in jobs.values():
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False


def test_every_action_is_pinned_by_commit_and_every_image_by_digest() -> None:
    uses = re.findall(r"uses: (\S+)(.*)", WORKFLOW_TEXT)
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), action
        assert re.fullmatch(r" # v\d+\.\d+\.\d+", comment), (action, comment)
    images = [j["container"]["image"] for j in WORKFLOW["jobs"].values() if "container" in j]
    assert images and all(re.search(r"@sha256:[0-9a-f]{64}$", i) for i in images), images
