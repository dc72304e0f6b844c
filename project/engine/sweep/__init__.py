"""Hyperparameter search (``make sweep``): Optuna proposes values for config keys, each trial is a normal ``fit``.

- ``spec.py``: the sweep file (configs/sweeps/*.yaml), checked against the CLI before anything runs.
- ``study.py``: where the trials live (a journal file, or a database for several machines), the lock around
  the count of trials, and the failing of trials whose worker is gone.
- ``workers.py``: a worker, Optuna's ``study.optimize`` with each trial's ``fit`` in a process of its own.
- ``trial.py``: the callback inside each trial's ``fit`` that reports the metric and prunes.
- ``report.py``: the table of trials, best.yaml and the plots.
- ``__main__.py``: ``python -m project.engine.sweep [SPEC] [--workers N] [--status]``.
"""
