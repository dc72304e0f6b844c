"""A pretrained Hugging Face encoder as the net of a text classifier, fully fine-tuned or with LoRA (needs the ``hf``
extra: ``pip install -e '.[hf]'``), and its export back to transformers (``configs/tasks/hf_text_classification.yaml``).

The model is read from a local directory or the local Hugging Face cache, never downloaded unless
``download: true``; its tokenizer is the data's (``data.tokenizer``, the same path). The head is new, sized by the
data's classes. With ``lora``, peft wraps the model: the base is frozen, the adapters and the head train.

    python -m project.hf logs/<name>/version_<N> [--out DIR]   # DIR/model (+ DIR/adapter, DIR/merged under LoRA)
"""

import argparse
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from project.data.labelled_text import pretrained_path, transformers_module
from project.engine.errors import ConfigError


@dataclass
class LoRA:
    """peft's ``LoraConfig``: adapters of rank ``r`` on ``target_modules`` (None: peft's default for the
    architecture, e.g. BERT's query and value; ``all-linear``: every linear layer but the head)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | str | None = None
    modules_to_save: list[str] = field(default_factory=list)  # besides the head, which SEQ_CLS always keeps


class HFClassifier(nn.Module):
    """``AutoModelForSequenceClassification`` from ``name_or_path`` with a new head of ``num_outputs`` classes:
    token ids in (padding with the tokenizer's pad id, masked out), logits out."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int,
        name_or_path: str,
        lora: LoRA | None = None,
        gradient_checkpointing: bool = False,
        attn_implementation: str | None = None,
        download: bool = False,
    ) -> None:
        """
        Args:
            input_shape: (max_length,), linked from the data.
            num_outputs: the classes, linked from the data.
            name_or_path: a directory ``save_pretrained`` wrote, or a hub id in the local cache.
            lora: train LoRA adapters (and the head) on a frozen base instead of every weight.
            gradient_checkpointing: recompute activations in the backward (less memory, ~30% more compute).
            attn_implementation: transformers' ``eager``, ``sdpa`` (its default where supported), ...
            download: allow fetching ``name_or_path`` from the hub.
        """
        super().__init__()
        transformers = transformers_module()
        key = "model.net.init_args.name_or_path"
        self.name_or_path = name_or_path
        path = pretrained_path(name_or_path, key, download)
        kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_outputs, dtype=torch.float32, ignore_mismatched_sizes=True,
            local_files_only=not download, **kwargs,
        )  # fmt: skip
        if gradient_checkpointing:  # non-reentrant: reentrant checkpointing breaks under DDP with LoRA (peft #313)
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.pad_id = self.model.config.pad_token_id
        if lora is not None:
            from peft import LoraConfig, TaskType, get_peft_model

            config = LoraConfig(task_type=TaskType.SEQ_CLS, r=lora.r, lora_alpha=lora.alpha,
                                lora_dropout=lora.dropout, target_modules=lora.target_modules,
                                modules_to_save=lora.modules_to_save or None)  # fmt: skip
            with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
                self.model = get_peft_model(self.model, config)
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            total = sum(p.numel() for p in self.model.parameters())
            print(f"LoRA: {trainable:,} of {total:,} parameters train ({100 * trainable / total:.2f}%)")
        # from_pretrained leaves the model in eval mode, and Lightning keeps each submodule's mode: dropout (and
        # LoRA's) would stay off for the whole run (Lightning #20105).
        self.model.train()

    def forward(self, ids: Tensor) -> Tensor:
        return self.model(input_ids=ids, attention_mask=(ids != self.pad_id).long(), use_cache=False).logits


def save_pretrained(run: str | Path, out: str | Path | None = None) -> Path:
    """A run's best checkpoint as transformers directories under ``out`` (default: ``<run>/hf``): ``model`` (the
    whole fine-tuned model; under LoRA the merged one) and, under LoRA, ``adapter`` (the adapter alone, for peft's
    ``PeftModel.from_pretrained`` on the base); each with the tokenizer and the class names in its config."""
    from project.engine.runs import load_run

    run = Path(run)
    model, data = load_run(run / "checkpoints" / "best.ckpt", read_data=False)
    net = model.net
    if not isinstance(net, HFClassifier):
        raise ConfigError(f"{run}: its net is {type(net).__name__}, not project.hf.HFClassifier.")
    out = Path(out) if out is not None else run / "hf"
    names = list(data.target_names)
    hf_model = net.model
    if hasattr(hf_model, "merge_and_unload"):  # LoRA: the adapter alone, then the base with the adapter merged in
        hf_model.save_pretrained(out / "adapter")
        hf_model = hf_model.merge_and_unload()
    hf_model.config.id2label = dict(enumerate(names))
    hf_model.config.label2id = {name: i for i, name in enumerate(names)}
    hf_model.config.problem_type = "single_label_classification"
    hf_model.save_pretrained(out / "model")
    tokenizer = data.tokenizer_object()
    for directory in (out / "model", out / "adapter"):
        if directory.is_dir():
            tokenizer.save_pretrained(directory)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m project.hf", description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run directory (logs/<name>/version_<N>)")
    parser.add_argument("--out", default=None, help="where the directories go (default: <run>/hf)")
    args = parser.parse_args(argv)
    try:
        out = save_pretrained(args.run, args.out)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"Wrote {', '.join(str(p) for p in sorted(out.iterdir()))}")


if __name__ == "__main__":  # through the package's module, whose classes the checkpoint's net is built from
    from project.hf import main as package_main

    package_main()
