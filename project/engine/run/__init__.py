"""A run from the command line: the ``LightningCLI`` (``cli``) and its parser (``parser``), the start-up checks of
a config (``checks``, ``callback_keys``), faults and exit codes (``faults``), the run directory (``run_directory``),
upstream's noise hidden (``quiet``), the learning-rate finder (``lr_find``).

Imports every part but ``sweep``, which builds on it."""
