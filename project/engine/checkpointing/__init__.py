"""Checkpoint files: written so that a crash never leaves a truncated one (``checkpoint_io``), ``last.ckpt`` at the
right moments (``last_checkpoint``), the random state a resume restores (``rng``), the data state a run carries to
another machine (``portable``), a net's weights read from a file (``weights``).

Imports only ``errors`` and ``hooks``: every other part builds on it."""
