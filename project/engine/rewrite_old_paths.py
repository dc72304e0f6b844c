"""``python -m project.engine.rewrite_old_paths [FILE ...]``: the engine's module paths from before its parts (see
``moved.py``) rewritten in your files (code, configs, notebooks, pages): to the engine's API (``from project.engine
import Task``, ``class_path: project.engine.EMA``), or for a name outside it to its module's new path. Lists what it
changed; ``make update-engine`` runs it after merging. Run records (``logs/``) keep theirs: they load as they are."""

import argparse
import importlib
import re
import subprocess
from pathlib import Path

from project.engine import PUBLIC
from project.engine.moved import MOVED, PACKAGE, new_paths

STAYED = ("errors", "hooks")  # paths that did not move, whose names your code takes from the API all the same


def _home(old: str, name: str) -> str:
    """Where code names ``name`` of the old module ``old`` now: the API, else the new module that defines it."""
    if name in PUBLIC:
        return PACKAGE
    homes = [f"{PACKAGE}.{old}"] if old in STAYED else new_paths(old)
    for path in homes:
        if hasattr(importlib.import_module(path), name):
            return path
    return homes[0]


def rewrite(text: str) -> str:
    """``text`` with every old engine path in it replaced (imports, dotted names as configs write them)."""
    olds = "|".join(sorted([*MOVED, *STAYED], key=len, reverse=True))
    engine = re.escape(PACKAGE)

    def imports(match: re.Match[str]) -> str:
        indent, old, names = match.group(1), match.group(2), match.group(3).strip("()")
        by_home: dict[str, list[str]] = {}
        for item in (n.strip() for n in names.replace("\n", " ").split(",")):
            if item:
                by_home.setdefault(_home(old, item.split(" as ")[0].strip()), []).append(item)
        return "\n".join(f"{indent}from {home} import {', '.join(items)}" for home, items in by_home.items())

    text = re.sub(rf"(?m)^([ \t]*)from {engine}\.({olds}) import (\([^)]*\)|[^\n#]*[^\s#])", imports, text)
    text = re.sub(rf"\b{engine}\.({olds})\.([A-Za-z_]\w*)\b", lambda m: f"{_home(m[1], m[2])}.{m[2]}", text)
    moved = "|".join(sorted(MOVED, key=len, reverse=True))
    return re.sub(rf"\b{engine}\.({moved})\b(?![\w.])", lambda m: new_paths(m[1])[0], text)


def _isort_order(name: str) -> tuple[int, str]:
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)  # constants, classes, the rest


def _merged(text: str) -> str:
    """The ``from <the API> import ...`` lines of one block of imports (one indent, no other line between) as one, at
    the first's place, its names in isort's order: the rewrite may leave one per old module where one import does."""
    form = rf"[ \t]*from {re.escape(PACKAGE)} import ([\w, ]+)"
    out: list[str] = []
    api: int | None = None  # where the block's import of the API stands in ``out``
    block: str | None = None  # the block's indent (None: not in a block of imports)
    for line in text.split("\n"):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)] if stripped.startswith(("from ", "import ")) else None
        if indent is None or indent != block:
            api, block = None, indent
        if (this := re.fullmatch(form, line)) and api is not None and (there := re.fullmatch(form, out[api])):
            names = {n.strip() for n in f"{there[1]},{this[1]}".split(",")} - {""}
            out[api] = f"{indent}from {PACKAGE} import {', '.join(sorted(names, key=_isort_order))}"
            continue
        if this:
            api = len(out)
        out.append(line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.rewrite_old_paths", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="default: every file git knows here but the engine's")
    args = parser.parse_args(argv)
    engine_dir = PACKAGE.replace(".", "/") + "/"
    files = args.files
    if not files:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, text=True)  # fmt: skip
        if listed.returncode != 0:
            parser.exit(2, f"error: no git repository here to list your files ({listed.stderr.strip()}): name them.\n")
        kinds = {".py", ".yaml", ".yml", ".ipynb", ".md", ".toml", ".sh"}
        files = [
            Path(f) for f in listed.stdout.splitlines() if not f.startswith(engine_dir) and Path(f).suffix in kinds
        ]
    changed = []
    for path in files:
        if path.is_file() and (text := path.read_text()) != (new := rewrite(text)):
            new = _merged(new) if path.suffix == ".py" else new
            path.write_text(new)
            changed.append(str(path))
    if changed:
        print(f"Rewrote the engine's old paths in {len(changed)} files: {', '.join(changed)}")


if __name__ == "__main__":
    main()
