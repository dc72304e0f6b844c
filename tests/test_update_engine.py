"""``make update-engine``: a newer template's machinery merges into a repository made from an older one, three
ways, renamed to its package; your rooms are never touched. On a local newer commit of the template, no network.
Copied as it is into a new repository (it names no package)."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, ROOT
from shipped_examples import selected_by

pytestmark = [
    pytest.mark.slow,
    pytest.mark.guarantee(
        "`make update-engine` merges a newer template's machinery (the package's `engine/`, the engine tests, "
        "`scripts/`, `benchmarks/`, the Makefile) three ways into a repository made from an older one, renamed to "
        "its package: the template's changes arrive, yours stay, both on one line are conflict markers named in "
        "one sentence (exit 1), new files come, your configs are untouched, `template.toml` records the newer "
        "commit; a repository with uncommitted changes is refused"
    ),
]
NEW = "acme"
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


@pytest.fixture
def template_and_repo(tmp_path: Path) -> tuple[Path, Path]:
    """This checkout as a template of its own (one commit), and a repository made from it (no example but what
    configs/default.yaml selects: yours, whatever it is)."""
    template = tmp_path / "template"
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    for name in subprocess.run(listed, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0"):
        if name and (ROOT / name).is_file():
            (template / name).parent.mkdir(parents=True, exist_ok=True)
            (template / name).write_bytes((ROOT / name).read_bytes())
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the template"]):
        _git(template, *step)
    repo = tmp_path / NEW
    keep = selected_by((ROOT / "configs" / "default.yaml").read_text()) or ["none"]
    made = subprocess.run([sys.executable, str(template / "scripts" / "new_project.py"), "--name", NEW, "--dest",
                           str(repo), "--keep", *keep], capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    return template, repo


def _update(repo: Path, template: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(repo / "scripts" / "update_engine.py"), "--template", str(template),
                           "--repo", str(repo)], capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_newer_templates_machinery_merges_into_the_repository_three_ways(
    template_and_repo: tuple[Path, Path],
) -> None:
    template, repo = template_and_repo
    engine, ours = template / PACKAGE / "engine", repo / NEW / "engine"
    # The template's later commit: a fix to the monitor, one to errors.py's first line, a new engine module that
    # imports the package, and a change to a config (yours: never taken).
    _edit(engine / "monitor.py", "import resource\n", "import resource  # a later fix\n")
    first_line = (engine / "errors.py").read_text().splitlines()[0]
    _edit(engine / "errors.py", first_line + "\n", first_line + "  # the template's\n")
    (engine / "later.py").write_text(f"from {PACKAGE}.engine.errors import ConfigError\n")
    config = template / "configs" / "default.yaml"  # whatever it holds: a line of the template's on top
    config.write_text("# the template's later default\n" + config.read_text())
    _git(template, "add", "-A")
    _git(template, "commit", "-qm", "later fixes")
    # Yours: a change of your own in the engine (the end of the monitor), the same first line of errors.py, and
    # your config.
    (ours / "monitor.py").write_text((ours / "monitor.py").read_text() + "# mine\n")
    _edit(ours / "errors.py", first_line + "\n", first_line + "  # mine\n")
    (repo / "configs" / "default.yaml").write_text((repo / "configs" / "default.yaml").read_text() + "# mine\n")
    _git(repo, "commit", "-qam", "my changes")

    updated = _update(repo, template)
    assert updated.returncode == 1, updated.stderr  # a conflict: named, with markers, nothing committed
    assert f"with conflict markers: {NEW}/engine/errors.py" in updated.stdout
    monitor = (ours / "monitor.py").read_text()
    assert "import resource  # a later fix\n" in monitor and monitor.endswith("# mine\n")  # both changes
    assert "<<<<<<< yours" in (ours / "errors.py").read_text()
    assert (ours / "later.py").read_text() == f"from {NEW}.engine.errors import ConfigError\n"  # renamed
    config = (repo / "configs" / "default.yaml").read_text()
    assert config.endswith("# mine\n") and "the template's later default" not in config  # your room: untouched
    head = _git(template, "rev-parse", "HEAD").strip()
    assert f'commit = "{head}"' in (repo / "template.toml").read_text()
    changed = {line[3:] for line in _git(repo, "status", "--porcelain").splitlines()}
    assert changed == {f"{NEW}/engine/monitor.py", f"{NEW}/engine/errors.py", f"{NEW}/engine/later.py",
                       "template.toml"}  # fmt: skip


def test_an_update_of_a_repository_with_uncommitted_changes_is_refused(template_and_repo: tuple[Path, Path]) -> None:
    template, repo = template_and_repo
    (repo / "configs" / "default.yaml").write_text("not committed\n")
    updated = _update(repo, template)
    assert updated.returncode == 2 and "has uncommitted changes: commit or stash them first" in updated.stderr
    assert _git(repo, "status", "--porcelain").strip() == "M configs/default.yaml"
