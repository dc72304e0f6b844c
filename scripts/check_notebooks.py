"""Fail, naming them, when notebooks carry outputs or execution counts (a pre-commit hook: notebooks are
committed clean, so diffs show code, not images). Strip them with
`jupyter nbconvert --clear-output --inplace notebooks/*.ipynb`."""

import json
import sys


def has_outputs(path: str) -> bool:
    with open(path) as handle:
        cells = json.load(handle).get("cells", [])
    return any(c.get("outputs") or c.get("execution_count") is not None for c in cells if c["cell_type"] == "code")


if __name__ == "__main__":
    dirty = [path for path in sys.argv[1:] if has_outputs(path)]
    for path in dirty:
        print(f"{path}: has outputs; strip them: jupyter nbconvert --clear-output --inplace {path}")
    sys.exit(1 if dirty else 0)
