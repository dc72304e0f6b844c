"""``make update-engine`` (copier update, copier.yml): a newer version of the template merges into a repository made
from an older one, three ways, renamed to its package. On a scratch git copy of this checkout with a later commit,
no network; the template's own, so a new repository has none."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import PACKAGE, ROOT
from shipped_examples import selected_by
from test_new_project import BIN, make, run, template_copy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.manual,
    pytest.mark.guarantee(
        "`make update-engine` (copier update) merges the template's newer version into a repository made from an "
        "older one, three ways, renamed to its package: a file you did not change takes the template's change, "
        "your change to a file it did not change stays, both changing the same lines leaves conflict markers "
        "named in one sentence (make fails), new files come renamed, your own files are untouched, "
        "`.copier-answers.yml` records the newer commit; a repository with uncommitted changes is refused"
    ),
]
NEW = "acme"


def _git(cwd: Path, *args: str) -> str:
    done = run("git", *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


@pytest.fixture
def template_and_repo(tmp_path: Path) -> tuple[Path, Path]:
    """This checkout as a template (one commit), and a repository copier made from it, committed (no example but
    what configs/default.yaml selects: yours, whatever it is)."""
    template, repo = template_copy(tmp_path / "template"), tmp_path / NEW
    keep = selected_by((ROOT / "configs" / "default.yaml").read_text())
    copied = run(BIN / "copier", "copy", "--trust", "--quiet", "--defaults", "--vcs-ref", "HEAD", "--data",
                 f"package={NEW}", "--data", f"keep={json.dumps(keep)}", template, repo, cwd=tmp_path)  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "mine"]):
        _git(repo, *step)
    return template, repo


def test_a_newer_template_merges_into_the_repository_three_ways(template_and_repo: tuple[Path, Path]) -> None:
    template, repo = template_and_repo
    engine, ours = template / PACKAGE / "engine", repo / NEW / "engine"
    # The template's later commit: a fix to the monitor, one to errors.py's first line, a new engine module that
    # imports the package, a line on top of the default config.
    _edit(engine / "observe" / "monitor.py", "import resource\n", "import resource  # a later fix\n")
    first_line = (engine / "errors.py").read_text().splitlines()[0]
    _edit(engine / "errors.py", first_line + "\n", first_line + "  # the template's\n")
    (engine / "later.py").write_text(f"from {PACKAGE}.engine.errors import ConfigError\n")
    config = template / "configs" / "default.yaml"
    config.write_text("# the template's later default\n" + config.read_text())
    _git(template, "add", "-A")
    _git(template, "commit", "-qm", "later fixes")
    # Yours: a change to a file the template leaves alone (observe/runs.py), the same first line of errors.py, the end
    # of your config, and a file of your own that names the template's package folder (a rename would change it).
    (ours / "observe" / "runs.py").write_text((ours / "observe" / "runs.py").read_text() + "# mine\n")
    _edit(ours / "errors.py", first_line + "\n", first_line + "  # mine\n")
    (repo / "configs" / "default.yaml").write_text((repo / "configs" / "default.yaml").read_text() + "# mine\n")
    (repo / "HISTORY.md").write_text(f"Made from the template, whose package was `{PACKAGE}/`.\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "my changes")

    updated = make("update-engine", cwd=repo)
    assert updated.returncode == 2, updated.stdout + updated.stderr  # make fails: conflicts to resolve
    assert f"Conflict markers in: {NEW}/engine/errors.py - resolve them" in updated.stderr, updated.stderr
    errors = (ours / "errors.py").read_text()
    assert f"<<<<<<< before updating\n{first_line}  # mine\n=======\n{first_line}  # the template's\n>>>>>>>" in errors
    assert (
        "import resource  # a later fix\n" in (ours / "observe" / "monitor.py").read_text()
    )  # yours unchanged: theirs
    assert (ours / "observe" / "runs.py").read_text().endswith("# mine\n")  # theirs unchanged: yours
    assert (ours / "later.py").read_text() == f"from {NEW}.engine.errors import ConfigError\n"  # new, renamed
    config = (repo / "configs" / "default.yaml").read_text()
    assert config.startswith("# the template's later default\n") and config.endswith("# mine\n")  # both
    assert (repo / "HISTORY.md").read_text() == f"Made from the template, whose package was `{PACKAGE}/`.\n"
    assert not (repo / PACKAGE).exists()  # the package stays renamed
    # copier records `git describe --tags --always` of its clone: an abbreviation whose length is git's to choose,
    # written as YAML (quoted when it is all digits, such as '4305234'). It must resolve, in the template, to its
    # newest commit.
    answers = (repo / ".copier-answers.yml").read_text()
    recorded = str(yaml.safe_load(answers)["_commit"])
    resolved = run("git", "rev-parse", "--verify", "--quiet", f"{recorded}^{{commit}}", cwd=template).stdout.strip()
    assert resolved == _git(template, "rev-parse", "HEAD").strip(), answers
    changed = {line[3:] for line in _git(repo, "status", "--porcelain").splitlines()}
    assert changed == {f"{NEW}/engine/observe/monitor.py", f"{NEW}/engine/errors.py", f"{NEW}/engine/later.py",
                       "configs/default.yaml", ".copier-answers.yml"}  # fmt: skip


def test_an_update_of_a_repository_with_uncommitted_changes_is_refused(template_and_repo: tuple[Path, Path]) -> None:
    _, repo = template_and_repo
    (repo / "configs" / "default.yaml").write_text("not committed\n")
    updated = make("update-engine", cwd=repo)
    assert updated.returncode != 0 and "Destination repository is dirty; cannot continue" in updated.stderr
    assert _git(repo, "status", "--porcelain").strip() == "M configs/default.yaml"
    assert subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".copier-answers.yml"], cwd=repo).returncode == 0


@pytest.mark.parametrize("tag", ["v2-bar"])
def test_a_template_tag_that_is_no_version_is_named_in_one_sentence(
    tag: str, template_and_repo: tuple[Path, Path]
) -> None:
    template, repo = template_and_repo
    (template / "configs" / "default.yaml").write_text(
        "# later\n" + (template / "configs" / "default.yaml").read_text()
    )
    _git(template, "commit", "-qam", "later")
    _git(template, "tag", tag)
    before = _git(repo, "rev-parse", "HEAD")
    updated = make("update-engine", cwd=repo)
    assert updated.returncode == 2, updated.stdout + updated.stderr
    said = [line for line in updated.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and f"('{tag}')" in said[0] and "PEP 440" in said[0], updated.stderr
    assert _git(repo, "rev-parse", "HEAD") == before and not _git(repo, "status", "--porcelain").strip()
    # What it advises works: the tag replaced by a version, the update merges.
    _git(template, "tag", "-d", tag)
    _git(template, "tag", "v1.3")
    updated = make("update-engine", cwd=repo)
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert (repo / "configs" / "default.yaml").read_text().startswith("# later\n")
