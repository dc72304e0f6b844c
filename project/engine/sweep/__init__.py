"""Hyperparameter search (``make sweep``): Optuna proposes values for config keys, each trial is a normal ``fit``.

- ``spec.py``: the sweep file (configs/sweeps/*.yaml), checked against the CLI before anything runs.
- ``workers.py``: the study (a journal file beside the trials), the workers that run trials, the reaper.
- ``trial.py``: the callback inside each trial's ``fit`` that reports the metric and prunes.
- ``report.py``: the table of trials, best.yaml and the plots.
- ``__main__.py``: ``python -m project.engine.sweep [SPEC] [--workers N] [--status]``.
"""
