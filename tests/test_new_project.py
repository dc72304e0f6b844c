"""``make new-project``: your own repository, the package renamed everywhere code names it, one commit, and its
tests pass there. Copied as it is into the new repository (it names no package), so it checks the next one too."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import manual  # scripts/ (conftest puts it on the path)
import new_project
import pytest
from conftest import PACKAGE, ROOT
from shipped_examples import EXAMPLES, present, selected_by, with_needs

# The template making a repository of yours (its examples and manual as they ship): `make check-manual` (the
# template's CI) runs these; in your repository, whose README and examples are yours, `make test` leaves them out.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.manual,
    pytest.mark.guarantee(
        "`make new-project` renames the package wherever code names it (the new repository's tests of its configs, "
        "manual, guarantees and examples pass with the template's package unimportable; pyproject names only its "
        "tables `project`), one commit, `template.toml` records the commit; `KEEP` copies only the examples kept "
        "and what each builds on, without the others' files, imports, README text, guarantees and mutants; a "
        "bad `NAME`, a `DEST` holding files, an unknown example or a `KEEP` without the example "
        "`configs/default.yaml` selects is refused in one sentence, writing nothing"
    ),
]


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "new_project.py"), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


# Every example (the default), and only the table (with the engine and the offline default every repository keeps;
# in a repository without the table: no example), and what configs/default.yaml selects (whatever it is: yours).
SELECTED = selected_by((ROOT / "configs" / "default.yaml").read_text())
KEEPS = {"all": None, **({"table": ["table", *SELECTED]} if present("table") else {"none": SELECTED or ["none"]})}
NEW = "churn" if PACKAGE != "churn" else "churn_next"  # the new package: another name than this repository's


@pytest.fixture(scope="module", params=list(KEEPS))
def churn(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("new") / "churn"
    keep = KEEPS[request.param]
    made = _make("--name", NEW, "--dest", str(dest), *(["--keep", *keep] if keep else []))
    assert made.returncode == 0, made.stderr
    return dest


def test_the_new_repository_is_the_template_renamed_in_one_commit(churn: Path) -> None:
    git = lambda *a: subprocess.run(["git", *a], cwd=churn, capture_output=True, text=True, check=True).stdout  # noqa: E731
    assert len(git("log", "--format=%H").split()) == 1 and git("status", "--porcelain") == ""
    listed = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]  # what git keeps, new files too
    template_files = subprocess.run(listed, cwd=ROOT, capture_output=True, text=True).stdout.split()
    kept = json.loads(re.search(r"(?m)^examples = (.*)$", (churn / "template.toml").read_text()).group(1))
    left_out = {f for name, example in EXAMPLES.items() if name not in kept for f in example.files}
    expected = {new_project.rename(f, PACKAGE, NEW) for f in template_files
                if (ROOT / f).is_file() and f not in left_out}  # fmt: skip
    assert set(git("ls-files").split()) == expected | {"template.toml"}
    assert kept == [name for name in EXAMPLES if present(name)] or kept == with_needs(["table", *SELECTED])
    # What a left-out example was is gone with its files: its imports, its text on every page of the manual.
    every_page = manual.text(churn)
    layout = manual.section(churn, "Layout")[1]
    for name in set(EXAMPLES) - set(kept):
        assert f"<!-- example: {name} -->" not in every_page
        files = [Path(f).name for f in EXAMPLES[name].files if f.endswith(".py")]
        listed = [f for f in files if re.search(rf"\s{re.escape(f)}\s", layout)]
        assert not listed, f"the README's Layout lists {listed} of the left-out {name}"
        for module in EXAMPLES[name].modules:
            part, _, file = module.partition(".")
            assert f"{NEW}.{part}.{file} import" not in (churn / NEW / part / "__init__.py").read_text()
    assert (churn / NEW / "engine" / "cli.py").is_file() and not (churn / PACKAGE).exists()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert f'commit = "{head}"' in (churn / "template.toml").read_text()
    # No code names the old package any more: renaming again changes nothing (prose saying "project" stays).
    for relative in git("ls-files").split():
        path = churn / relative
        if relative in new_project.VERBATIM or path.suffix not in {".py", ".yaml", ".toml", ".md", ".ipynb", ""}:
            continue
        text = path.read_text()
        assert new_project.rename(text, PACKAGE, NEW, toml=relative == "pyproject.toml") == text, relative
    pyproject = (churn / "pyproject.toml").read_text()
    assert f'name = "{NEW}"' in pyproject and f'include = ["{NEW}*"]' in pyproject  # what pip installs
    named = [line for line in pyproject.splitlines() if re.search(rf"\b{PACKAGE}\b", line)]
    # the old name is left only in pyproject's own tables ([project], ...) and its description's prose
    left = [line for line in named if not (line.startswith("description = ") or new_project.TOML_TABLE.match(line))]
    assert left == [], left
    assert re.search(rf"(?m)^PACKAGE := {NEW}$", (churn / "Makefile").read_text())


def test_the_new_repositorys_tests_pass_in_it(churn: Path, tmp_path: Path) -> None:
    # Its configs (every class path), its CLI as a process (`-m churn`), its manual's modules and its guarantees
    # table, with this interpreter (its .venv is the user's to make: make install), in which the template's own
    # package is installed: a stub first on the path makes importing it an error, so nothing renamed is missed.
    stub = tmp_path / "blocked" / PACKAGE
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('the template\\'s package {PACKAGE} was imported')\n")
    tests = ["tests/test_config.py", "tests/test_repo_habits.py", "tests/test_guarantees.py", "tests/test_readme.py",
             "tests/test_shipped_examples.py"]  # fmt: skip
    skipped = "not precision and not debug_overlay and not compiled and not every_command"
    if (churn / "tests" / "test_regression.py").is_file():  # every example: its configs parse; the CLI process and
        skipped += " and not warmup and not net_is_swapped"  # the fits run in the repository with fewer (~10 s)
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-k", skipped, *tests],
                         cwd=churn, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(stub.parent)})  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert re.search(r"\d+ passed", ran.stdout) and NEW in (churn / "tests" / "conftest.py").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--name", "Churn-1"], "must be a Python identifier in lower case"), (["--name", "json"], "already importable"),
     (["--name", NEW, "--keep", "tabel"], "tabel is no example of this template; the examples are")],
    ids=["not-an-identifier", "shadows-a-module", "unknown-example"],
)  # fmt: skip
def test_bad_input_is_refused_in_one_sentence_writing_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    made = _make(*args, "--dest", str(tmp_path / "new"))
    assert made.returncode == 2 and message in made.stderr and "Traceback" not in made.stderr
    assert not (tmp_path / "new").exists()


def test_a_destination_that_holds_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "yours.txt").write_text("kept")
    made = _make("--name", NEW, "--dest", str(tmp_path))
    assert made.returncode == 2 and "exists and is not an empty folder" in made.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["yours.txt"]


def test_a_default_config_that_selects_a_left_out_example_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # configs/default.yaml is yours and the new repository keeps it: leaving out what it runs would leave that
    # repository without a default run (its test_config, contract suite and `make train` red).
    if not present("table"):
        pytest.skip("this repository has no table example to select")
    config = tmp_path / "default.yaml"
    config.write_text(f"data:\n  class_path: {PACKAGE}.data.CSVDataModule\n")
    monkeypatch.setattr(new_project, "DEFAULT_CONFIG", config)
    with pytest.raises(
        new_project.Refused, match=r"configs/default\.yaml selects the table example, which KEEP leaves"
    ):
        new_project.new_project(NEW, tmp_path / "new", ["none"])
    assert not (tmp_path / "new").exists()
