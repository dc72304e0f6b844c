"""What a run shows and keeps: the training monitor (``monitor``), the progress bar (``progress``), profiles
(``profiling``), TensorBoard's dashboard (``dashboard``), trackers (``tracking``), provenance (``provenance``,
``git_snapshot``), the divergence guard (``divergence``), the runs table (``runs``, ``config_keys``).

Imports ``model``, ``data``, ``checkpointing``, ``errors`` and ``hooks``; never ``inference`` (a sibling)."""
