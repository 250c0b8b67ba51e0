"""A copy of KEDA's module with only the scalers the product renders, and a go.mod building it.

KEDA compiles all of its ~80 scalers into one package (pkg/scalers), each with its service's SDK
(Kafka, Azure, AWS, GCP, databases, ...), so a build of its operator or metrics server compiles
about 176 MB of Go source. The operator renders only `prometheus` triggers and, at minReplicas 0,
the waker's `external-push` one (render/autoscaling.py, render/scale_to_zero.py); the copy drops
every other case of KEDA's trigger switch (pkg/scaling/scalers_builder.go, between its
TRIGGERS-START and TRIGGERS-END markers) and the files that define their constructors, so the rest
of KEDA (controllers, scale handler, metrics server, TriggerAuthentication, certificates) is built
unchanged from the module. A trigger of another type gets KEDA's own "no scaler found for type"
error.

    trim_scalers.py WRAPPER_DIR MODULE_DIR OUT_DIR TYPE...

writes the trimmed module to OUT_DIR/keda and the wrapper's go.mod (+ go.sum) with a `replace` of
KEDA by it to OUT_DIR, and prints that go.mod's path for `go build -modfile`. (A `go build -overlay`
would need no copy, but Go refuses overlays of files in its module cache.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

CASE = re.compile(r'^\s*case ((?:"[a-z0-9-]+"(?:, )?)+):\s*$')
CONSTRUCTOR = re.compile(r"scalers\.(New\w+)\(")


def trimmed_switch(source: str, keep: set[str]) -> tuple[str, set[str]]:
    """The builder without the cases of other trigger types, and the constructors it still calls."""
    head, start, rest = source.partition("// TRIGGERS-START")
    switch, end, tail = rest.partition("// TRIGGERS-END")
    if not start or not end:
        raise SystemExit("trim_scalers: KEDA's scalers_builder.go has no TRIGGERS-START/END markers")
    kept: list[str] = []
    found: set[str] = set()
    keeping = True
    for line in switch.splitlines(keepends=True):
        if case := CASE.match(line):
            types = set(re.findall(r'"([a-z0-9-]+)"', case.group(1)))
            keeping = bool(types & keep)
            found |= types & keep
        elif line.strip().startswith(("default:", "}", "switch ")):
            keeping = True
        elif line.strip().startswith("//"):
            continue  # a comment of a dropped case (upstream's "TODO: use other way for test.")
        if keeping:
            kept.append(line)
    if missing := keep - found:
        raise SystemExit(f"trim_scalers: KEDA has no trigger type {', '.join(sorted(missing))}")
    body = "".join(kept)
    return head + start + body + end + tail, set(CONSTRUCTOR.findall(body))


def declared(source: str) -> set[str]:
    """The package-level names a Go file declares (funcs, types, vars and consts, grouped or not)."""
    names = set(re.findall(r"^(?:func|type|var|const) (\w+)", source, re.M))
    for block in re.findall(r"^(?:var|const|type) \((.*?)^\)", source, re.M | re.S):
        names |= set(re.findall(r"^\t(\w+)", block, re.M))
    return names


def restore_helpers(wrapper: Path, modfile: Path, scalers: Path, dropped: dict[str, Path]) -> None:
    """Puts back the dropped files that define what the kept ones use (upstream shares helpers
    between scalers: the Prometheus scaler uses a constant of the Azure queue scaler's file), as
    the compiler names them: only the scalers package is compiled, its dependencies are needed by
    the build anyway."""
    names = {name: path for path in dropped.values() for name in declared(path.read_text())}
    package = "github.com/kedacore/keda/v2/pkg/scalers"
    while True:
        # -e: every undefined name at once, not the first ten.
        # -trimpath and -dwarf=false as the build that follows: it reuses what this compiled.
        command = ["go", "build", "-trimpath", "-modfile", str(modfile), "-gcflags=all=-dwarf=false",
                   f"-gcflags={package}=-e -dwarf=false", package]  # fmt: skip
        build = subprocess.run(command, cwd=wrapper, capture_output=True, text=True)
        if build.returncode == 0:
            return
        undefined = set(re.findall(r"undefined: (\w+)", build.stderr))
        restore = {names[name] for name in undefined if name in names}
        if not restore:
            raise SystemExit(f"trim_scalers: KEDA's scalers do not build trimmed:\n{build.stderr}")
        for path in restore:
            shutil.copyfile(path, scalers / path.name)
            names = {k: v for k, v in names.items() if v != path}


def main(wrapper: Path, module: Path, out: Path, keep: set[str]) -> Path:
    tree = out / "keda"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(module, tree, ignore=shutil.ignore_patterns("*_test.go", "testdata", "tests"))
    for path in [tree, *tree.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # the module cache's copies are read-only
    builder = tree / "pkg/scaling/scalers_builder.go"
    switch, constructors = trimmed_switch(builder.read_text(), keep)
    builder.write_text(switch)
    scalers = tree / "pkg/scalers"
    dropped = {}
    for path in scalers.glob("*_scaler.go"):
        if not declared(path.read_text()) & constructors:
            dropped[path.name] = module / "pkg/scalers" / path.name
            path.unlink()
    modfile = out / "go.mod"
    replace = f"\nreplace github.com/kedacore/keda/v2 => {tree}\n"
    modfile.write_text((wrapper / "go.mod").read_text() + replace)
    shutil.copyfile(wrapper / "go.sum", out / "go.sum")
    restore_helpers(wrapper, modfile, scalers, dropped)
    return modfile


if __name__ == "__main__":
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    print(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), set(sys.argv[4:])))
