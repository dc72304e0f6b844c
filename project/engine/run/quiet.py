"""Upstream lines the user can do nothing about, hidden where the CLI starts. Each names its upstream issue, and
``test_observability.py`` fails once upstream stops printing one, so that its filter goes too."""

import logging
import warnings


def hide_upstream_lines() -> None:
    # Lightning 2.6 advertises its cloud services on every run ("💡 Tip: ... litlogger", "... litmodels"), and has no
    # switch for it (Lightning #21294): those two lines are dropped from the logger its rank_zero_info writes to.
    tips = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    tips.addFilter(lambda record: not record.getMessage().startswith("💡 Tip"))
    # Lightning 2.6 calls torch's deprecated isinstance(treespec, LeafSpec) at every run, fixed upstream (Lightning
    # #21326): a line on every command the user can do nothing about.
    warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
    # Lightning 2.6's CLI calls jsonargparse APIs deprecated in 4.49 (Lightning #21900, fixed by #21906, unreleased):
    # four lines and jsonargparse's note on them wherever Python's warnings are shown (PYTHONWARNINGS, -W, pytest).
    warnings.filterwarnings(
        "ignore",
        r"(?s).*(deprecated in v4\.49\.0|only one JsonargparseDeprecationWarning)",
        DeprecationWarning,
        r"lightning\.pytorch\.cli",
    )
