"""A trained run afterwards: back from its checkpoint as its task and DataModule (``load``), its predictions
written (``predictions``), its network exported for other runtimes (``export``).

Imports ``model``, ``data``, ``checkpointing``, ``errors`` and ``hooks``; never ``observe`` (a sibling)."""
