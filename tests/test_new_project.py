"""``make new-project``: your own repository, the package renamed everywhere code names it, one commit, and its
tests pass there. Copied as it is into the new repository (it names no package), so it checks the next one too."""

import os
import re
import subprocess
import sys
from pathlib import Path

import new_project  # scripts/ (conftest puts it on the path)
import pytest
from conftest import PACKAGE, ROOT

pytestmark = pytest.mark.slow


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "new_project.py"), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("new") / "churn"
    made = _make("--name", "churn", "--dest", str(dest))
    assert made.returncode == 0, made.stderr
    return dest


def test_the_new_repository_is_the_template_renamed_in_one_commit(churn: Path) -> None:
    git = lambda *a: subprocess.run(["git", *a], cwd=churn, capture_output=True, text=True, check=True).stdout  # noqa: E731
    assert len(git("log", "--format=%H").split()) == 1 and git("status", "--porcelain") == ""
    listed = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]  # what git keeps, new files too
    template_files = subprocess.run(listed, cwd=ROOT, capture_output=True, text=True).stdout.split()
    expected = {new_project.rename(f, PACKAGE, "churn") for f in template_files if (ROOT / f).is_file()}
    assert set(git("ls-files").split()) == expected | {"template.toml"}
    assert (churn / "churn" / "engine" / "cli.py").is_file() and not (churn / PACKAGE).exists()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert f'commit = "{head}"' in (churn / "template.toml").read_text()
    # No code names the old package any more: renaming again changes nothing (prose saying "project" stays).
    for relative in git("ls-files").split():
        path = churn / relative
        if relative in new_project.VERBATIM or path.suffix not in {".py", ".yaml", ".toml", ".md", ".ipynb", ""}:
            continue
        text = path.read_text()
        assert new_project.rename(text, PACKAGE, "churn", toml=relative == "pyproject.toml") == text, relative
    assert 'name = "churn"' in (churn / "pyproject.toml").read_text()
    assert re.search(r"(?m)^PACKAGE := churn$", (churn / "Makefile").read_text())


def test_the_new_repositorys_tests_pass_in_it(churn: Path, tmp_path: Path) -> None:
    # Its configs (every class path), its CLI as a process (`-m churn`), its README's modules and its guarantees
    # table, with this interpreter (its .venv is the user's to make: make install), in which the template's own
    # package is installed: a stub first on the path makes importing it an error, so nothing renamed is missed.
    stub = tmp_path / "blocked" / PACKAGE
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('the template\\'s package {PACKAGE} was imported')\n")
    tests = ["tests/test_config.py", "tests/test_repo_habits.py", "tests/test_guarantees.py",
             "tests/test_readme.py::test_every_module_the_readme_runs_or_imports_exists"]  # fmt: skip
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-k", "not precision and not debug_overlay and not compiled", *tests],
                         cwd=churn, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(stub.parent)})  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert re.search(r"\d+ passed", ran.stdout) and "churn" in (churn / "tests" / "conftest.py").read_text()


@pytest.mark.parametrize(
    ("name", "message"),
    [("Churn-1", "must be a Python identifier in lower case"), ("json", "already importable here")],
)
def test_a_bad_name_is_refused_in_one_sentence_writing_nothing(name: str, message: str, tmp_path: Path) -> None:
    made = _make("--name", name, "--dest", str(tmp_path / "new"))
    assert made.returncode == 2 and message in made.stderr and "Traceback" not in made.stderr
    assert not (tmp_path / "new").exists()


def test_a_destination_that_holds_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "yours.txt").write_text("kept")
    made = _make("--name", "churn", "--dest", str(tmp_path))
    assert made.returncode == 2 and "exists and is not an empty folder" in made.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["yours.txt"]
