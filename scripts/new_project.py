"""copier's tasks after it renders this template (copier.yml's ``_tasks``, in the new repository): ``check`` refuses
what copier's questions cannot (a package name that would shadow an importable module; leaving out the example
configs/default.yaml selects); ``rename`` renames the package (pyproject's ``name``) wherever code names it and
cuts the left-out examples' imports and the manual's text a repository of yours does not need. It touches only the
files copier rendered, the same way for the same answers: `copier update` renders the old and new versions with it
and merges your changes three ways on top. Only the standard library.

    python scripts/new_project.py check NAME "REMOVED EXAMPLES" [KEPT EXAMPLE...]   # make new-project runs it first
    python scripts/new_project.py rename NAME "REMOVED EXAMPLES"    # in the new repository, as copier runs it
"""

import contextlib
import importlib.util
import json
import keyword
import re
import sys
from pathlib import Path

import shipped_examples

TEMPLATE = Path(__file__).resolve().parents[1]  # copier's checkout of the template at the version it renders
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
TOML_TABLE = re.compile(r"^\[project[\].]")  # pyproject.toml's own tables ([project], ...) keep their names
OLD = re.search(r'(?m)^name = "([^"]+)"', (TEMPLATE / "pyproject.toml").read_text()).group(1)  # type: ignore[union-attr]


def rename(text: str, name: str, toml: bool = False) -> str:
    patterns = [re.compile(p.format(old=re.escape(OLD)), re.M) for p in CODE_NAMES]
    if toml:
        patterns.append(re.compile(rf"^{re.escape(OLD)}(?= = )"))  # the console script
    table, kept = f'["{OLD}"]', "\0table\0"  # ["project"] reads pyproject's [project] table (a test does)
    lines = []
    for line in text.replace(table, kept).splitlines(keepends=True):
        if not (toml and TOML_TABLE.match(line)):
            for pattern in patterns:
                line = pattern.sub(name, line)
        lines.append(line)
    return "".join(lines).replace(kept, table)


def check(name: str, removed: list[str], keep: list[str], config: Path) -> str | None:
    """What is wrong with the answers, in one sentence; None: nothing."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):  # as copier.yml's validator says
        return (f"package={name!r}: the package's name must be a Python identifier in lower case that is no keyword "
                "(letters, digits, underscores; a letter first), e.g. churn.")  # fmt: skip
    if unknown := [n for n in keep if n not in shipped_examples.EXAMPLES]:
        return f"keep={' '.join(keep)!r}: {unknown[0]} is no example; they are {', '.join(shipped_examples.EXAMPLES)}."
    if name != OLD and (name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None):
        return (f"package={name!r}: a module of that name is already importable (the standard library or an installed "
                "package), which the new package would shadow or be shadowed by: choose another.")  # fmt: skip
    needed = [n for n in shipped_examples.selected_by(config.read_text(), TEMPLATE) if n in removed]
    if needed:
        return (f"configs/default.yaml selects the {needed[0]} example, which keep leaves out (the new repository "
                f"would have no default run): keep it too.")  # fmt: skip
    return None


def _without_modules(init: Path, modules: set[str]) -> None:
    """The package's ``__init__`` without the imports of left-out modules (and their names in ``__all__``)."""
    lines = init.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not ((m := re.match(r"from ([\w.]+) import ", line)) and m.group(1) in modules)]
    if kept == lines:
        return
    names = sorted(n.strip() for line in kept if (m := re.match(r"from [\w.]+ import (.+)", line))
                   for n in m.group(1).split(","))  # fmt: skip
    listed = f"__all__ = [{', '.join(map(json.dumps, names))}]"
    if len(listed) > 120:  # as ruff formats it
        listed = "__all__ = [\n" + "".join(f"    {json.dumps(n)},\n" for n in names) + "]"
    init.write_text(re.sub(r"__all__ = \[.*?\](  # fmt: skip)?", lambda _: listed, "".join(kept), flags=re.S))


def _without_extras(pyproject: Path, extras: set[str]) -> None:
    """pyproject.toml without the left-out examples' extras: their lines with the comment lines that lead them, and
    their names in the lists of extras (dev's)."""
    kept: list[str] = []
    lead: list[str] = []
    for line in pyproject.read_text().splitlines(keepends=True):
        if line.startswith("#"):
            lead.append(line)
            continue
        if not re.match(rf"(?:{'|'.join(map(re.escape, extras))}) = ", line):
            kept += [*lead, line]
        lead = []
    listed = lambda m: m[1] + ",".join(e for e in m[2].split(",") if e not in extras) + "]"  # noqa: E731
    pyproject.write_text(re.sub(r'("\w+\[)([\w,]+)\]', listed, "".join(kept + lead)))


def _named(gone: list[str], removed: list[str], name: str) -> set[str]:
    """How the manual names the template's files a repository lacks: the path; a Python file also by its name, its
    module and its classes as the package exports them; a config also by its runs' folder (``logs/<logger name>``)."""
    names = {n for f in gone for n in (f, Path(f).name if f.endswith(".py") else f)}
    names |= {n for example in removed for n in shipped_examples.names(example, TEMPLATE)}
    configs = [(TEMPLATE / f).read_text() for f in gone if f.startswith("configs/") and f.endswith(".yaml")]
    names |= {f"logs/{n}" for text in configs for n in re.findall(r"(?m)^ +name: ([\w.-]+)$", text)}
    return {rename(n, name) for n in names}


def _manual_without(pages: list[Path], name: str, removed: list[str], gone: list[str]) -> None:
    """The manual's pages as a repository of yours needs them: the README titled with its name; without the text
    only the template needs (``<!-- template -->``) and the removed examples' (``<!-- example: NAME -->``); outside
    it, without every table row that names a file it lacks, and in a code block every line that does (a line led
    by comments: with them), and a code block left empty."""
    names = _named(gone, removed, name)
    named = lambda line: any(re.search(rf"(?<![\w/.]){re.escape(n)}(?![\w])", line) for n in names)  # noqa: E731
    for page in pages:
        text = re.sub(r"\A# .*", f"# {name}", page.read_text()) if page.name == "README.md" else page.read_text()
        for marker in ["template", *(f"example: {example}" for example in removed)]:
            text = re.sub(rf"<!-- {marker} -->.*?<!-- /{marker} -->\n?", "", text, flags=re.S)
        kept, block, groups = [], None, []
        for line in text.splitlines(keepends=True):
            if line.startswith("```") and block is None:
                block, groups = line, []
            elif line.startswith("```"):  # a block's end: its groups that name nothing it lacks, if any line is left
                lines = [x for group in groups if not any(map(named, group)) for x in group]
                kept += [block, *lines, line] if "".join(lines).strip() else []
                block = None
            elif block is not None:  # a comment line leads the lines after it; a line under no comment is alone
                led = bool(groups) and groups[-1][0].startswith("#")
                if not led or (line.startswith("#") and not groups[-1][-1].startswith("#")):
                    groups.append([line])
                else:
                    groups[-1].append(line)
            elif not (line.startswith("|") and named(line)):
                kept.append(line)
        page.write_text(re.sub(r"\n{3,}", "\n\n", "".join(kept)))


def rename_rendered(name: str, removed: list[str], dest: Path) -> None:
    """Renames the package in the files copier rendered from this template into ``dest`` (during `copier update`,
    your other files are left alone), then cuts what the removed examples were."""
    left_out = {f for n in removed for f in shipped_examples.EXAMPLES[n].files}
    files = (str(p.relative_to(TEMPLATE)) for p in TEMPLATE.rglob("*") if p.is_file())
    ours = sorted(f for f in files if not f.startswith(".git/"))  # the template's files, not its git folder
    rendered = [f for f in ours if f not in left_out and (dest / f).is_file()]
    for relative in rendered:
        source, target = dest / relative, dest / rename(relative, name)
        data = source.read_bytes()
        with contextlib.suppress(UnicodeDecodeError):  # a binary file: as it is
            data = rename(data.decode("utf-8"), name, toml=relative == "pyproject.toml").encode("utf-8")
        if target != source:  # into the package's new folder (over your file there: copier merges yours back)
            target.parent.mkdir(parents=True, exist_ok=True)
            source.replace(target)
        target.write_bytes(data)
    # The folders only the old package's name or the left-out files held, deepest first.
    folders = {(dest / rename(f, name)).parent for f in left_out} | set((dest / OLD).glob("**/") if name != OLD else ())
    for folder in sorted(folders, reverse=True):
        with contextlib.suppress(OSError):  # what is left there is not ours
            folder.rmdir()
    modules = {rename(f[:-3], name).replace("/", ".") for f in left_out if re.match(rf"{OLD}/.*\.py$", f)}
    for init in (dest / rename(f, name) for f in rendered if f.endswith("__init__.py")):
        _without_modules(init, modules)
    if extras := {x for n in removed for x in shipped_examples.EXAMPLES[n].extras}:
        _without_extras(dest / "pyproject.toml", extras)
    gone = sorted(left_out | {f for f in ours if not (dest / rename(f, name)).exists()})
    pages = [dest / f for f in rendered if re.fullmatch(r"README\.md|docs/[^/]+\.md", f)]
    _manual_without(pages, name, removed, gone)


def main(argv: list[str]) -> int:
    step, name, removed, keep = argv[0], argv[1], argv[2].split(), argv[3:]
    if step == "check" and (wrong := check(name, removed, keep, TEMPLATE / "configs" / "default.yaml")):
        print(f"error: {wrong}", file=sys.stderr)
        return 2
    if step == "check" and keep:  # a task of its own (regression) is an example of its own: say what stays out
        kept = shipped_examples.with_needs(keep)
        left = ", ".join(n for n in shipped_examples.EXAMPLES if n not in kept)
        print(f"Examples kept: {', '.join(n for n in shipped_examples.EXAMPLES if n in kept)}; left out: {left}.")
    if step == "rename":
        rename_rendered(name, removed, Path.cwd())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
