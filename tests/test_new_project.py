"""``make new-project`` (copier copy of this template, copier.yml): your own repository, the package renamed wherever
code names it, only the examples kept, one commit, and its tests pass there. On a scratch git copy of this checkout
(copier reads a template from git), never the checkout itself; the template's own, so a new repository has none."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import manual  # scripts/ (conftest puts it on the path)
import pytest
import shipped_examples
from conftest import PACKAGE, ROOT
from shipped_examples import EXAMPLES, present, with_needs

# The template making a repository of yours (its examples and manual as they ship): `make check-manual` (the
# template's CI) runs these.
pytestmark = [pytest.mark.slow, pytest.mark.manual]
NEW = "churn"
BIN = Path(sys.executable).parent  # copier, in this interpreter's environment (the dev install has it)
# Your name on no commit: the tests' own, for git and for the commits copier makes in its scratch folders.
GIT_ENV = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@localhost", "GIT_COMMITTER_NAME": "test",
           "GIT_COMMITTER_EMAIL": "test@localhost"}  # fmt: skip
# What makes and updates repositories: the template's, never copied into one.
TEMPLATE_ONLY = {"copier.yml", "{{ _copier_conf.answers_file }}.jinja", "scripts/new_project.py",
                 "tests/test_new_project.py", "tests/test_update_engine.py"}  # fmt: skip
# Where code names a package: a dotted path, a path into it, `-m pkg`, `import pkg`, `from pkg`.
CODE_NAMES = r"(?<![\w.-]){0}\.[A-Za-z_]|(?<![\w.-]){0}/|-m {0}\b|\bimport {0}\b|\bfrom {0}\b"


def run(*args: str | Path, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **GIT_ENV, **kwargs.pop("env", {})}  # type: ignore[dict-item]
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def make(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A target of the Makefile at ``cwd``, with copier and Python from this environment (the copy has no .venv)."""
    return run("make", "--no-print-directory", *args, f"BIN={BIN}", f"PYTHON={sys.executable}", cwd=cwd)


def template_copy(into: Path) -> Path:
    """This checkout's files (what git tracks and new files it does not ignore) as a template: a git repository."""
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    for name in subprocess.run(listed, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0"):
        if name and (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes((ROOT / name).read_bytes())
            (into / name).chmod((ROOT / name).stat().st_mode)
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the template"]):
        assert run("git", *step, cwd=into).returncode == 0
    return into


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return template_copy(tmp_path_factory.mktemp("template"))


# Every example (the default), and the regression alone (which brings the table it reads), if the template has it.
KEEPS = {"all": list(EXAMPLES), **({"regression": ["regression"]} if present("regression") else {})}


@pytest.fixture(scope="module", params=list(KEEPS))
def churn(request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("new") / NEW
    keep = "all" if request.param == "all" else " ".join(KEEPS[request.param])
    made = make("new-project", f"NAME={NEW}", f"DEST={dest}", f"KEEP={keep}", cwd=template)
    assert made.returncode == 0, made.stdout + made.stderr
    return dest


@pytest.mark.guarantee(
    "`make new-project` (copier copy) renames the package wherever code names it (imports, the configs' class "
    "paths, `-m`, pyproject's name, extras and console script, the Makefile's `PACKAGE`), in one commit with "
    "`.copier-answers.yml`; `KEEP` copies only the examples kept and what each builds on, without the others' "
    "files, imports and text in the manual; the template's own copier files stay behind"
)
def test_the_new_repository_is_the_template_renamed_with_only_the_kept_examples(churn: Path, template: Path) -> None:
    git = lambda *a: run("git", *a, cwd=churn).stdout  # noqa: E731
    assert len(git("log", "--format=%H").split()) == 1 and git("status", "--porcelain") == ""
    answers = (churn / ".copier-answers.yml").read_text()
    keep = re.findall(r"(?m)^- (\w+)$", answers)
    kept = with_needs(keep)
    assert f"package: {NEW}" in answers and f"_src_path: {template}" in answers
    left_out = {f for name in set(EXAMPLES) - kept for f in EXAMPLES[name].files}
    expected = {re.sub(rf"^{PACKAGE}/", f"{NEW}/", f) for f in git("-C", template, "ls-files").splitlines()
                if f not in left_out and f not in TEMPLATE_ONLY}  # fmt: skip
    assert set(git("ls-files").splitlines()) == expected | {".copier-answers.yml"}
    assert not (churn / PACKAGE).exists() and (churn / NEW / "engine" / "run" / "cli.py").is_file()
    # No code names the old package: every text file, the manual's code included (its prose says "project").
    for relative in git("ls-files").splitlines():
        if relative != ".copier-answers.yml":
            named = re.findall(rf".*(?:{CODE_NAMES.format(PACKAGE)}).*", (churn / relative).read_text())
            named = [line for line in named if not line.startswith("[project")]  # pyproject's own tables
            assert not named, f"{relative} still names {PACKAGE}: {named[:3]}"
    default = (churn / "configs" / "default.yaml").read_text()
    assert f"class_path: {NEW}.engine.AtomicCheckpointIO" in default
    assert f"-m {NEW} fit" in (churn / "Makefile").read_text()
    assert re.search(rf"(?m)^PACKAGE := {NEW}$", (churn / "Makefile").read_text())
    pyproject = (churn / "pyproject.toml").read_text()
    assert f'name = "{NEW}"' in pyproject and f'include = ["{NEW}*"]' in pyproject  # what pip installs
    assert f'{NEW} = "{NEW}.engine.run.cli:main"' in pyproject and f'"{NEW}[notebooks,' in pyproject
    # The left-out examples' extras are gone (their packages are not installed for nothing), dev's list too.
    for extra in {x for name in set(EXAMPLES) - kept for x in EXAMPLES[name].extras}:
        assert not re.search(rf"(?m)^{extra} = |[\[,]{extra}[\],]", pyproject), extra
    named = [line for line in pyproject.splitlines() if re.search(rf"\b{PACKAGE}\b", line)]
    # the old name is left only in pyproject's own tables ([project], ...) and its description's prose
    assert all(line.startswith(("[project", "description = ")) for line in named), named
    # What a left-out example was is gone with its files: its imports, its text on every page of the manual.
    every_page, layout = manual.text(churn), manual.section(churn, "Layout")[1]
    inits = (churn / NEW / "tasks" / "__init__.py").read_text() + (churn / NEW / "data" / "__init__.py").read_text()
    for name in set(EXAMPLES) - kept:
        assert f"<!-- example: {name} -->" not in every_page
        for file in [f for f in EXAMPLES[name].files if f.startswith(f"{PACKAGE}/") and f.endswith(".py")]:
            module = file.removesuffix(".py").replace("/", ".").replace(PACKAGE, NEW, 1)
            assert f"from {module} import" not in inits
            assert not re.search(rf"\s{re.escape(Path(file).name)}\s", layout), f"the Layout lists {file}"
    # Nor is what only the template has (making repositories: <!-- template -->, copier.yml, new_project.py), and
    # every code block still shows something: a command or code, not only the comments of cut lines.
    assert every_page.startswith(f"# {NEW}\n") and "<!-- template -->" not in every_page
    assert not re.search(r"(?<![\w/.])(copier\.yml|new_project\.py)(?![\w])", layout)
    lost = [n for name in set(EXAMPLES) - kept for n in shipped_examples.names(name, template)]
    assert not [n for n in lost if re.search(rf"(?<![\w.]){re.escape(n.replace(PACKAGE, NEW, 1))}(?![\w])", every_page)]
    for config in (f for name in set(EXAMPLES) - kept for f in EXAMPLES[name].files if f.startswith("configs/")):
        for logged in re.findall(r"(?m)^ +name: ([\w.-]+)$", (template / config).read_text()):
            assert f"logs/{logged}/" not in every_page, f"the manual shows a run of {config}, which is left out"
    for block in re.findall(r"(?ms)^```\w*\n(.*?)^```", every_page):
        assert any(line.strip() and not line.startswith("#") for line in block.splitlines()), block
    for name in kept:  # what is kept stays, its text too
        assert all((churn / re.sub(rf"^{PACKAGE}/", f"{NEW}/", f)).is_file() for f in EXAMPLES[name].files)
        marker = f"<!-- example: {name} -->"
        assert every_page.count(marker) == manual.text(template).count(marker)


@pytest.mark.guarantee(
    "a repository from `make new-project` passes its own tests of its configs, manual and examples "
    "with the template's package unimportable"
)
def test_the_new_repositorys_tests_pass_in_it(churn: Path, tmp_path: Path) -> None:
    # Its configs (every class path), its CLI as a process (`-m churn`), and its manual's modules,
    # with this interpreter (its .venv is the user's to make: make install), in which the template's own package
    # is installed: a stub first on the path makes importing it an error, so nothing renamed is missed.
    stub = tmp_path / "blocked" / PACKAGE
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('the template\\'s package {PACKAGE} was imported')\n")
    tests = ["tests/test_config.py", "tests/test_repo_habits.py", "tests/test_readme.py",
             "tests/test_shipped_examples.py", "tests/test_gpu_check.py"]  # fmt: skip
    skipped = "not precision and not debug_overlay and not compiled and not every_command"
    if (churn / "tests" / "test_regression.py").is_file():  # every example: its configs parse; the CLI process and
        skipped += " and not warmup and not net_is_swapped"  # the fits run in the repository with fewer (~10 s)
    ran = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-k", skipped,
              *tests, cwd=churn, env={"PYTHONPATH": str(stub.parent)})  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert re.search(r"\d+ passed", ran.stdout) and NEW in (churn / "tests" / "conftest.py").read_text()


def test_the_new_repositorys_layout_contracts_hold_on_its_renamed_package(churn: Path) -> None:
    # make lint's import contracts (pyproject.toml's [tool.importlinter]) name the package: renamed with it.
    linted = run(BIN / "lint-imports", "--no-cache", cwd=churn, env={"PYTHONPATH": str(churn)})
    assert linted.returncode == 0 and "0 broken" in linted.stdout, linted.stdout[-3000:] + linted.stderr[-2000:]


def test_make_example_data_writes_the_kept_examples_data_only(churn: Path, tmp_path: Path) -> None:
    kept = with_needs(re.findall(r"(?m)^- (\w+)$", (churn / ".copier-answers.yml").read_text()))
    written = {"images": "images", "table": "table.csv", "regression": "regression.csv", "multilabel": "tags.csv",
               "text_classification": "lines.csv", "segmentation": "segmentation"}  # fmt: skip
    if importlib.util.find_spec("transformers"):  # the hf extra's models
        written |= {"hf": "tiny-bert", "sft": "tiny-chat"}
    made = run(sys.executable, "scripts/make_example_data.py", "--out", tmp_path, "--per-class", "4", cwd=churn)
    assert made.returncode == 0, made.stderr[-2000:]
    found = {p.name for p in tmp_path.iterdir()} - {"chats.jsonl", "prompts.txt"}
    assert found == {name for example, name in written.items() if example in kept}, made.stdout


@pytest.mark.guarantee(
    "a bad package name (not a lower-case identifier, a keyword, a module of the standard library or one "
    "installed), an unknown example or a `DEST` holding files is refused in one sentence naming it, writing "
    "nothing; so is leaving out the example `configs/default.yaml` selects"
)
@pytest.mark.parametrize(
    ("name", "keep", "message", "copier_says"),
    [("Churn-1", "table", "package='Churn-1': the package's name must be a Python identifier in lower case",
      "Validation error for question 'package': package='Churn-1': the package's name must be"),
     ("class", "table", "package='class': the package's name must be",
      "Validation error for question 'package': package='class': the package's name must be"),
     ("json", "table", "package='json': a module of that name is already importable",
      "error: package='json': a module of that name is already importable"),
     ("torch", "table", "package='torch': a module of that name is already importable",
      "error: package='torch': a module of that name is already importable"),
     (NEW, "table tabel", "tabel is no example; they are table,", "Invalid choice for 'keep': 'tabel' is not in")],
    ids=["not-an-identifier", "keyword", "stdlib", "installed", "unknown-example"],
)  # fmt: skip
def test_bad_input_is_refused_in_one_sentence_writing_nothing(
    name: str, keep: str, message: str, copier_says: str, template: Path, tmp_path: Path
) -> None:
    made = make("new-project", f"NAME={name}", f"DEST={tmp_path / 'new'}", f"KEEP={keep}", cwd=template)
    errors = [line for line in made.stderr.splitlines() if not line.startswith("make: ***")]
    assert made.returncode == 2 and len(errors) == 1 and message in errors[0], made.stderr
    assert not (tmp_path / "new").exists()
    # copier itself refuses it too, writing nothing: copier.yml's questions (before it writes), its task's check
    # (after: copier then deletes the folder it made).
    copied = run(BIN / "copier", "copy", "--trust", "--defaults", "--vcs-ref", "HEAD", "--data", f"package={name}",
                 "--data", f"keep=[{keep.replace(' ', ', ')}]", template, tmp_path / "new", cwd=tmp_path)  # fmt: skip
    assert copied.returncode != 0 and copier_says in copied.stderr, copied.stderr[-2000:]
    assert not (tmp_path / "new").exists()


@pytest.mark.guarantee(
    "a bad package name (not a lower-case identifier, a keyword, a module of the standard library or one "
    "installed), an unknown example or a `DEST` holding files is refused in one sentence naming it, writing "
    "nothing; so is leaving out the example `configs/default.yaml` selects"
)
def test_a_destination_holding_files_or_a_left_out_default_is_refused(template: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / "yours.txt").parent.mkdir()
    (dest / "yours.txt").write_text("kept")
    made = make("new-project", f"NAME={NEW}", f"DEST={dest}", cwd=template)
    assert made.returncode == 2 and f"DEST='{dest}' exists and is not an empty folder" in made.stderr
    assert [p.name for p in dest.iterdir()] == ["yours.txt"]
    # configs/default.yaml is yours and the new repository keeps it: leaving out what it runs would leave that
    # repository without a default run (its test_config, contract suite and `make train` red).
    if not present("table"):
        pytest.skip("this template has no table example to select")
    template = template_copy(tmp_path / "template")  # one of its own: its default config changes
    config = template / "configs" / "default.yaml"
    config.write_text(config.read_text() + f"data:\n  class_path: {PACKAGE}.data.CSVDataModule\n")
    assert run("git", "commit", "-qam", "the table by default", cwd=template).returncode == 0
    made = make("new-project", f"NAME={NEW}", f"DEST={tmp_path / 'new'}", "KEEP=none", cwd=template)
    assert made.returncode != 0, made.stdout
    assert "error: configs/default.yaml selects the table example, which keep leaves out" in made.stderr
    assert not (tmp_path / "new").exists()


def test_the_check_says_which_examples_are_kept_and_which_are_left_out() -> None:
    """A task of its own (the Regressor) is an example of its own: KEEP=table leaves it out, and says so."""
    for keep in (["table"], [list(EXAMPLES)[-1]]):
        said = run(sys.executable, ROOT / "scripts" / "new_project.py", "check", "churn", "", *keep, cwd=ROOT).stdout
        kept = with_needs(keep)
        assert said.splitlines() == [f"Examples kept: {', '.join(n for n in EXAMPLES if n in kept)}; left out: "
                                     f"{', '.join(n for n in EXAMPLES if n not in kept)}."]  # fmt: skip
