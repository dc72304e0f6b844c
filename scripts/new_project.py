"""Your own repository from this template: ``make new-project NAME=churn DEST=../churn KEEP="table regression"``.

Copies the template's files (what git tracks, and new files git does not ignore: never .venv, logs or data), with
the package (pyproject's ``name``: ``project`` in the template) renamed to NAME everywhere code names it (imports,
class paths in the configs, ``-m <package>``, paths into it, pyproject's package name, extras and console script,
the Makefile's PACKAGE, the notebooks, the manual's code), then makes DEST a fresh git repository with one commit.
Prose that says "project" in English is left as it is; ``template.toml`` records the template's commit it came
from. This file and its test are copied as they are: they name no package, so a repository made from the template
makes others the same way.

Only the standard library: it runs before any install. Bad input (a name Python cannot import, or one that would
shadow an installed package; a DEST that exists and is not empty; a template that is not a git checkout) exits 2
with one sentence, having written nothing.
"""

import argparse
import importlib.util
import json
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

import manual
import shipped_examples

TEMPLATE = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = TEMPLATE / "configs" / "default.yaml"  # your choice of task and data: the new repository keeps it
VERBATIM = (
    "scripts/new_project.py",
    "tests/test_new_project.py",
    "scripts/update_engine.py",
    "tests/test_update_engine.py",
)

# Where code names the package (never "pyproject", never "the project's"): a dotted module path, a path into the
# package, `-m pkg`, `import pkg`/`from pkg`, the name as a whole string ("pkg", "pkg[dev]", "pkg*"), in
# backticks, and the Makefile's PACKAGE.
CODE_NAMES = [
    r"(?<![\w.-]){old}(?=\.[A-Za-z_])",
    r"(?<![\w.-]){old}(?=/)",
    r"(?<=-m ){old}\b",
    r"(?<=\bimport ){old}\b",
    r"(?<=\bfrom ){old}\b",
    r"(?<=[\"'`]){old}(?=[\"'`\[*])",
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
    # ["project"] reads pyproject's [project] table (a test does), whose name stays.
    table, kept = f'["{old}"]', "\0table\0"
    return _rename(text.replace(table, kept), old, name, toml).replace(kept, table)


def _rename(text: str, old: str, name: str, toml: bool) -> str:
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


def kept_examples(keep: list[str] | None) -> list[str]:
    """KEEP -> the examples to copy, with those they build on; a name that is none is refused."""
    shipped = [n for n in shipped_examples.EXAMPLES if shipped_examples.present(n, TEMPLATE)]
    if keep is None or keep == ["all"]:
        return shipped
    if keep == ["none"]:
        return []
    unknown = [n for n in keep if n not in shipped]
    if unknown:
        raise Refused(f"KEEP={' '.join(keep)!r}: {', '.join(unknown)} is no example of this template; the examples "
                      f"are {', '.join(shipped)} (or all, or none).")  # fmt: skip
    return shipped_examples.with_needs(keep)


def _without_modules(init: Path, name: str, modules: list[str]) -> None:
    """The package's ``__init__`` without the imports of deleted modules (and their names in ``__all__``)."""
    if not init.is_file():
        return
    lines = []
    for line in init.read_text().splitlines(keepends=True):
        found = re.match(rf"from {name}\.([\w.]+) import ", line)
        if not (found and found.group(1) in modules):
            lines.append(line)
    names = sorted(n.strip() for line in lines if (m := re.match(rf"from {name}\.[\w.]+ import (.+)", line))
                   for n in m.group(1).split(","))  # fmt: skip
    listed = f"__all__ = [{', '.join(map(json.dumps, names))}]"
    if len(listed) > 120:  # as ruff formats it
        listed = "__all__ = [\n" + "".join(f"    {json.dumps(n)},\n" for n in names) + "]"
    text = re.sub(r"__all__ = \[.*?\](  # fmt: skip)?", lambda _: listed, "".join(lines), flags=re.S)
    init.write_text(text)


def _manual_without(dest: Path, removed: list[str], gone: list[str]) -> None:
    """The manual (README.md and docs/*.md) without the removed examples: on every page their marked text; outside
    it, every table row and command line that names one of their files (``gone``: paths in the new repository; a
    Python file also by its name alone, as the README's Layout lists it). Their guarantees go with their tests."""
    names = {n for f in gone for n in (f, Path(f).name if f.endswith(".py") else f)}
    names |= {f.removesuffix(".py").replace("/", ".") for f in gone if f.endswith(".py") and not f.startswith("tests/")}
    for page in manual.pages(dest):
        text = page.read_text()
        for example in removed:
            text = re.sub(rf"<!-- example: {example} -->.*?<!-- /example: {example} -->\n?", "", text, flags=re.S)
        kept_lines, fenced = [], False
        for line in text.splitlines(keepends=True):
            fenced ^= line.startswith("```")
            table_or_code = line.startswith("|") or (fenced and not line.startswith("```"))
            if not (table_or_code and any(re.search(rf"(?<![\w/.]){re.escape(n)}(?![\w])", line) for n in names)):
                kept_lines.append(line)
        page.write_text("".join(kept_lines))


def new_project(name: str, dest: Path, keep: list[str] | None = None) -> Path:
    old = package_name()
    check(old, name, dest)
    kept = kept_examples(keep)
    removed = [n for n in shipped_examples.EXAMPLES if n not in kept]
    needed = [n for n in shipped_examples.selected_by(DEFAULT_CONFIG.read_text(), TEMPLATE) if n in removed]
    if needed:
        raise Refused(f"KEEP={' '.join(keep or [])!r}: configs/default.yaml selects the {needed[0]} example, which "
                      f"KEEP leaves out (the new repository would have no default run): keep it too, e.g. "
                      f"KEEP=\"{' '.join([*(keep or []), needed[0]])}\".")  # fmt: skip
    left_out = {f for n in removed for f in shipped_examples.EXAMPLES[n].files}
    files = [f for f in template_files() if f not in left_out]
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
    modules = [m for n in removed for m in shipped_examples.EXAMPLES[n].modules]  # "tasks.regression"
    for part in ("tasks", "data"):
        _without_modules(dest / name / part / "__init__.py", name, modules)
    if removed:
        gone = [rename(f, old, name) for f in sorted(left_out)]
        _manual_without(dest, removed, gone)
    (dest / "template.toml").write_text(
        "# Where this repository came from (scripts/new_project.py wrote it): the template's checkout and commit.\n"
        f'source = "{TEMPLATE}"\ncommit = "{commit}"\ndirty = {str(dirty).lower()}\npackage = "{name}"\n'
        f"examples = {json.dumps(kept)}\n"
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
    parser.add_argument("--keep", nargs="+", help="the shipped examples to copy (default: all; none: no example)")
    args = parser.parse_args(argv)
    try:
        dest = new_project(args.name, args.dest.resolve(), args.keep)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"New repository {dest} (package {args.name}), one commit. Next: cd {dest} && make install && make test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
