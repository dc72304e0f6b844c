"""The ``DataModule`` base (``datamodule``) and what it owns: loaders and their settings (``loaders``), samplers
that resume mid-epoch and shard without padding (``samplers``), what a batch holds (``batches``), normalisation
(``normalization``), the data contract (``data_contract``), what ``predict`` reads (``predict_inputs``).

Imports ``checkpointing`` (the data state a checkpoint keeps), ``errors`` and ``hooks``."""
