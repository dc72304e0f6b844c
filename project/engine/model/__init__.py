"""The ``Task`` base (``task``) and what training a net takes: the optimizer and its schedule (``optimization``,
``parts``), accumulation (``accumulation``), the loss's exact means (``metrics``), the metric a task is judged by
and the callbacks that follow it (``monitored``), fine-tuning (``finetuning``), FSDP units (``sharding``), weight
averaging (``ema``), the task contract (``task_contract``).

Imports ``data``, ``checkpointing``, ``errors`` and ``hooks``."""
