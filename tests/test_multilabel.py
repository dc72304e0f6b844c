"""The multi-label example (project/tasks/multilabel.py): the one-file custom task the manual shows."""

import manual  # scripts/ (conftest puts it on the path)
import pytest
from conftest import ROOT


@pytest.mark.guarantee("the manual's custom task is the shipped file, and trained by the contract suite")
@pytest.mark.guarantee(
    "every checkpoint loads with `weights_only=True`; hparams are plain data; the net is rebuilt from them"
)
@pytest.mark.manual  # the template's manual shows the file: `make check-manual`, not `make test`
def test_the_custom_task_is_one_short_file_shown_verbatim_in_the_readme() -> None:
    source = (ROOT / "project" / "tasks" / "multilabel.py").read_text()
    body = source.split('"""', 2)[2].lstrip("\n")  # the file without its docstring
    assert f"```python\n{body}```" in manual.text(ROOT), "the manual's custom task differs from the file"
