"""The README is the manual: what it names exists (tests it cites as proof, config files, make targets, modules)."""

import ast
import re

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def _test_names() -> dict[str, set[str]]:
    return {
        path.name: {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
        for path in (ROOT / "tests").glob("test_*.py")
    }


def test_every_test_the_readme_cites_exists() -> None:
    names, missing, last = _test_names(), [], None
    # `test_x.py::name`, and the `...::name` that follow it in the same row (the same file).
    for match in re.finditer(r"`(test_\w+\.py)(?:::(\w+))?[^`]*`|`\.\.\.::(\w+)`", README):
        file, name = (match.group(1), match.group(2)) if match.group(1) else (last, match.group(3))
        last = file
        if file not in names or (name and name not in names[file]):
            missing.append(f"{file}::{name}" if name else file)
    assert not missing, f"the README cites tests that do not exist: {missing}"


def test_every_config_file_the_readme_names_exists() -> None:
    configs = set(re.findall(r"(?<![\w/])(?:tests/)?configs/[\w/.-]+\.yaml\b", README))
    absent = sorted(c for c in configs if not (ROOT / c).is_file() and "mine" not in c and "my_" not in c)
    assert not absent, f"the README names config files that do not exist: {absent}"


def test_every_make_target_the_readme_runs_exists() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):.*##", (ROOT / "Makefile").read_text(), re.M))
    code = re.findall(r"```bash\n(.*?)```", README, re.S) + re.findall(r"`([^`\n]+)`", README)  # commands only
    used = {m for block in code for m in re.findall(r"(?:^|\s)make ([a-z][\w-]*)", block, re.M)}
    assert used <= targets, f"the README runs make targets the Makefile lacks: {sorted(used - targets)}"


def test_every_module_the_readme_runs_or_imports_exists() -> None:
    modules = set(re.findall(r"python -m (project[\w.]*)", README)) | set(
        re.findall(r"from (project[\w.]*) import", README)
    )
    absent = [m for m in sorted(modules) if not (ROOT / (m.replace(".", "/") + ".py")).is_file()
              and not (ROOT / m.replace(".", "/") / "__init__.py").is_file()]  # fmt: skip
    assert not absent, f"the README names modules that do not exist: {absent}"
