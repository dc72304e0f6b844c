"""Your own repository from this template: ``make new-project NAME=churn DEST=../churn``.

Copies the template's files (what git tracks, and new files git does not ignore: never .venv, logs or data), with
the package (pyproject's ``name``: ``project`` in the template) renamed to NAME everywhere code names it (imports,
class paths in the configs, ``-m <package>``, paths into it, pyproject's package name, extras and console script,
the Makefile's PACKAGE, the notebooks, the README's code), then makes DEST a fresh git repository with one commit.
Prose that says "project" in English is left as it is; ``template.toml`` records the template's commit it came
from. This file and its test are copied as they are: they name no package, so a repository made from the template
makes others the same way.

Only the standard library: it runs before any install. Bad input (a name Python cannot import, or one that would
shadow an installed package; a DEST that exists and is not empty; a template that is not a git checkout) exits 2
with one sentence, having written nothing.
"""

import argparse
import importlib.util
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1]
VERBATIM = ("scripts/new_project.py", "tests/test_new_project.py")

# Where code names the package (never "pyproject", never "the project's"): a dotted module path, a path into the
# package, `-m pkg`, `import pkg`/`from pkg`, the name as a whole string ("pkg", "pkg[dev]", "pkg*"), in
# backticks, and the Makefile's PACKAGE.
CODE_NAMES = [
    r"(?<![\w.-]){old}(?=\.[A-Za-z_])",
    r"(?<![\w.-]){old}(?=/)",
    r"(?<=-m ){old}\b",
    r"(?<=\bimport ){old}\b",
    r"(?<=\bfrom ){old}\b",
    r"(?<=[\"'`])(?<!\[[\"']){old}(?=[\"'`\[*])",  # not ["project"]: pyproject's table, read by a test
    r"(?<=^PACKAGE := ){old}\b",
]
# pyproject.toml's own tables ([project], [project.optional-dependencies], [project.scripts]) keep their names.
TOML_TABLE = re.compile(r"^\[project[\].]")


def package_name() -> str:
    """pyproject.toml's ``name`` (tomllib is Python >= 3.11; the template supports 3.10)."""
    found = re.search(r'(?m)^name = "([^"]+)"', (TEMPLATE / "pyproject.toml").read_text())
    if found is None:
        raise Refused(f'{TEMPLATE / "pyproject.toml"} names no package (a line name = "...").')
    return found.group(1)


class Refused(Exception):
    """Bad input: one sentence, exit 2."""


def rename(text: str, old: str, name: str, toml: bool = False) -> str:
    patterns = [re.compile(p.format(old=re.escape(old)), re.M) for p in CODE_NAMES]
    if toml:
        patterns.append(re.compile(rf"^{re.escape(old)}(?= = )"))  # the console script
    lines = []
    for line in text.splitlines(keepends=True):
        if not (toml and TOML_TABLE.match(line)):
            for pattern in patterns:
                line = pattern.sub(name, line)
        lines.append(line)
    return "".join(lines)


def template_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=TEMPLATE,
                             capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        raise Refused(f"the template at {TEMPLATE} is not a git checkout: clone it with git first.") from None
    return sorted(p for p in out.stdout.split("\0") if p and (TEMPLATE / p).is_file())


def check(old: str, name: str, dest: Path) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise Refused(f"NAME={name!r}: the package's name must be a Python identifier in lower case (letters, "
                      "digits, underscores; a letter first), e.g. NAME=churn.")  # fmt: skip
    if name != old and (name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None):
        raise Refused(f"NAME={name!r}: a module of that name is already importable here (the standard library or "
                      "an installed package), which the new package would shadow or be shadowed by: choose "
                      "another.")  # fmt: skip
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Refused(f"DEST={str(dest)!r} exists and is not an empty folder: name a new one.")


def new_project(name: str, dest: Path) -> Path:
    old = package_name()
    check(old, name, dest)
    files = template_files()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=TEMPLATE, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=TEMPLATE, capture_output=True, text=True).stdout)
    dest.mkdir(parents=True, exist_ok=True)
    for relative in files:
        source = TEMPLATE / relative
        target = dest / rename(relative, old, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file: copied as it is
            text = None
        if text is None or relative in VERBATIM:
            shutil.copy2(source, target)
            continue
        target.write_text(rename(text, old, name, toml=relative == "pyproject.toml"), encoding="utf-8")
        shutil.copymode(source, target)
    (dest / "template.toml").write_text(
        "# Where this repository came from (scripts/new_project.py wrote it): the template's checkout and commit.\n"
        f'source = "{TEMPLATE}"\ncommit = "{commit}"\ndirty = {str(dirty).lower()}\npackage = "{name}"\n'
    )
    git = ["git", "-c", "user.name=new-project", "-c", "user.email=new-project@localhost",
           "-c", "init.defaultBranch=main"]  # fmt: skip
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    changes = " (with local changes)" if dirty else ""
    message = f"{name}: a new project from the Lightning template at {commit[:12]}{changes}"
    subprocess.run([*git, "commit", "-q", "-m", message], cwd=dest, check=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the new package's name (a lower-case Python identifier)")
    parser.add_argument("--dest", required=True, type=Path, help="the new repository's folder (new or empty)")
    args = parser.parse_args(argv)
    try:
        dest = new_project(args.name, args.dest.resolve())
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"New repository {dest} (package {args.name}), one commit. Next: cd {dest} && make install && make test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
