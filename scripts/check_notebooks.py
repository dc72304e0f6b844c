"""Fail, naming them, when notebooks carry outputs or execution counts (a pre-commit hook: notebooks are
committed clean, so diffs show code, not images). ``--clear`` strips them in place:
`python scripts/check_notebooks.py --clear notebooks/*.ipynb` (plain JSON: nothing to install)."""

import json
import sys
from pathlib import Path


def _code_cells(notebook: dict) -> list[dict]:
    return [c for c in notebook.get("cells", []) if c["cell_type"] == "code"]


def has_outputs(path: str) -> bool:
    with open(path) as handle:
        cells = _code_cells(json.load(handle))
    return any(c.get("outputs") or c.get("execution_count") is not None for c in cells)


def clear(path: str) -> None:
    with open(path) as handle:
        notebook = json.load(handle)
    for cell in _code_cells(notebook):
        cell["outputs"], cell["execution_count"] = [], None
    with open(path, "w") as handle:  # as Jupyter writes notebooks: indent 1, UTF-8 as is, a final newline
        handle.write(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(__doc__))
    paths = [p for p in sys.argv[1:] if p != "--clear"]
    if missing := [p for p in paths if not Path(p).is_file()]:
        sys.exit(print(f"error: no such notebook: {missing[0]}", file=sys.stderr) or 2)
    if "--clear" in sys.argv[1:]:
        for path in paths:
            clear(path)
    dirty = [path for path in paths if has_outputs(path)]
    for path in dirty:
        print(f"{path}: has outputs; strip them: python scripts/check_notebooks.py --clear {path}")
    sys.exit(1 if dirty else 0)
