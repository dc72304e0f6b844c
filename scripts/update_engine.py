"""A newer template's machinery into your repository: ``make update-engine`` (TEMPLATE=path of a newer checkout of
the template; default: template.toml's ``source``).

What is updated is the machinery you were told to leave alone: the package's ``engine/``, the engine tests and
their fixtures (tests/ without the examples' files), ``scripts/``, ``benchmarks/`` and the Makefile. Your rooms
(configs/, the tasks, data and nets, the examples you kept, the README and docs/, the notebooks, pyproject.toml) are
never touched. Each file is merged three ways, as git merges a branch: the template at template.toml's ``commit`` (the
base you started from) and at the newer checkout's HEAD, both renamed to your package as `make new-project` did,
against your file. Unchanged by you: it becomes the template's. Changed by you only: kept. Changed by both: merged
(``git merge-file``), with conflict markers where the two changes overlap. New in the template: added; deleted
there and unchanged here: deleted. Then template.toml records the newer commit.

Nothing is committed: review with ``git diff``, run ``make test``, commit. Exit 0 when everything merged, 1 when
some files hold conflict markers (named), 2 for bad input (not a clean git checkout made by `make new-project`, a
template path that is not a git checkout of the template), having written nothing.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import new_project
import shipped_examples

HERE = Path(__file__).resolve().parents[1]


class Refused(Exception):
    """Bad input: one sentence, exit 2."""


def _git(cwd: Path, *args: str, check: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise Refused(f"git {' '.join(args)} in {cwd} failed: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout


def _origin(repo: Path) -> dict[str, str]:
    path = repo / "template.toml"
    if not path.is_file():
        raise Refused(f"{repo} has no template.toml: it was not made by `make new-project` (nothing to merge against).")
    return dict(re.findall(r'(?m)^(\w+) = "([^"]*)"$', path.read_text()))


def example_files(template: Path) -> set[str]:
    """Every file of a shipped example, as this repository's list and the newer template's name them (an example
    added since is no machinery either)."""
    namespace: dict = {"__file__": str(template / "scripts" / "shipped_examples.py"), "__name__": "_newer_examples"}
    exec(_git(template, "show", "HEAD:scripts/shipped_examples.py"), namespace)  # the template's own list
    lists = (shipped_examples.EXAMPLES, namespace["EXAMPLES"])
    return {f for examples in lists for example in examples.values() for f in example.files}


def machinery(path: str, package: str, examples: set[str]) -> bool:
    """Whether ``path`` (in the template, its own package name) is the machinery `make update-engine` updates."""
    if path in examples:
        return False
    return (
        path.startswith((f"{package}/engine/", "scripts/", "benchmarks/"))
        or path == "Makefile"
        or (path.startswith("tests/") and not path.startswith("tests/data/"))
    )


def _files_at(template: Path, commit: str, package: str, examples: set[str]) -> dict[str, str]:
    """The machinery's files of the template at ``commit``: {path: text}."""
    listed = _git(template, "ls-tree", "-r", "--name-only", commit).split("\n")
    return {p: _git(template, "show", f"{commit}:{p}") for p in listed if p and machinery(p, package, examples)}


def update(repo: Path, template: Path) -> tuple[list[str], list[str], list[str]]:
    """Merges the newer template's machinery into ``repo``: (updated, merged with your changes, conflicted)."""
    origin = _origin(repo)
    if _git(repo, "status", "--porcelain"):
        raise Refused(f"{repo} has uncommitted changes: commit or stash them first, so the update is one diff.")
    if not (template / ".git").exists() or not (template / "scripts" / "new_project.py").is_file():
        raise Refused(f"TEMPLATE={str(template)!r} is not a git checkout of the template.")
    old_package = re.search(r'(?m)^name = "([^"]+)"', _git(template, "show", "HEAD:pyproject.toml")).group(1)  # type: ignore[union-attr]
    base_commit, name = origin["commit"], origin["package"]
    if _git(template, "cat-file", "-t", base_commit, check=False).strip() != "commit":
        raise Refused(f"TEMPLATE={str(template)!r} lacks commit {base_commit[:12]} (template.toml's): use the checkout "
                      "this repository was made from, or a clone of it with its history.")  # fmt: skip
    head = _git(template, "rev-parse", "HEAD").strip()
    examples = example_files(template)
    base = _files_at(template, base_commit, old_package, examples)
    theirs = _files_at(template, head, old_package, examples)
    updated, merged, conflicted = [], [], []
    for path in sorted(set(base) | set(theirs)):
        ours_path = repo / new_project.rename(path, old_package, name)
        verbatim = path in new_project.VERBATIM  # copied as they are by `make new-project`
        old, new = (t if t is None or verbatim else new_project.rename(t, old_package, name, toml=False)
                    for t in (base.get(path), theirs.get(path)))  # fmt: skip
        ours = ours_path.read_text() if ours_path.is_file() else None
        if new == old or ours == new:
            continue  # the template did not change it, or you already have its version
        if ours == old:  # unchanged by you: the template's
            if new is None:
                ours_path.unlink()
            else:
                ours_path.parent.mkdir(parents=True, exist_ok=True)
                ours_path.write_text(new)
            updated.append(str(ours_path.relative_to(repo)))
            continue
        if ours is None or new is None:  # deleted on one side and changed on the other: yours stays, named
            conflicted.append(str(ours_path.relative_to(repo)))
            continue
        with tempfile.TemporaryDirectory() as scratch:
            files = [Path(scratch) / n for n in ("ours", "base", "theirs")]
            for file, text in zip(files, (ours, old or "", new), strict=True):
                file.write_text(text)
            result = subprocess.run(["git", "merge-file", "-p", "-L", "yours", "-L", f"template {base_commit[:12]}",
                                     "-L", f"template {head[:12]}", *map(str, files)],
                                    capture_output=True, text=True)  # fmt: skip
        ours_path.write_text(result.stdout)
        (conflicted if result.returncode else merged).append(str(ours_path.relative_to(repo)))
    text = (repo / "template.toml").read_text()
    (repo / "template.toml").write_text(re.sub(r'(?m)^commit = "[^"]*"$', f'commit = "{head}"', text))
    return updated, merged, conflicted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", type=Path, help="a newer checkout of the template (default: template.toml's)")
    parser.add_argument("--repo", type=Path, default=HERE, help="your repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        template = args.template or Path(_origin(args.repo)["source"])
        updated, merged, conflicted = update(args.repo.resolve(), template.resolve())
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    named = [f"{len(files)} {what}{': ' + ', '.join(files) if files and what != 'updated' else ''}"
             for what, files in (("updated", updated), ("merged with your changes", merged),
                                 ("with conflict markers", conflicted))]  # fmt: skip
    print(f"From the template's machinery: {'; '.join(named)}. Review with git diff, run make test, commit.")
    return 1 if conflicted else 0


if __name__ == "__main__":
    sys.exit(main())
