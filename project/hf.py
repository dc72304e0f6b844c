"""Pretrained Hugging Face models as nets, fully fine-tuned or with LoRA (needs the ``hf`` extra: ``pip install -e
'.[hf]'``), and their export back to transformers: an encoder that classifies texts (``HFClassifier``,
``configs/tasks/hf_text_classification.yaml``) and a causal language model fine-tuned on chats (``HFCausalLM``,
``configs/tasks/sft.yaml``).

A model is read from a local directory or the local Hugging Face cache, never downloaded unless ``download: true``;
its tokenizer is the data's too (``data.tokenizer``, the same path). With ``lora``, peft wraps the model: the base is
frozen, the adapters (and a classifier's new head) train; ``dtype: nf4`` loads that base in 4 bits (QLoRA, the
``qlora`` extra: bitsandbytes).

    python -m project.hf logs/<name>/version_<N> [--out DIR]   # DIR/model (+ DIR/adapter under LoRA)
"""

import argparse
import hashlib
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from project.data.labelled_text import pretrained_path, transformers_module
from project.engine import ConfigError


@dataclass
class LoRA:
    """peft's ``LoraConfig``: adapters of rank ``r`` on ``target_modules`` (None: peft's default for the
    architecture, e.g. BERT's query and value; ``all-linear``: every linear layer but the head)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | str | None = None
    modules_to_save: list[str] = field(default_factory=list)  # besides the head, which SEQ_CLS always keeps


class _Pretrained(nn.Module):
    """What both nets share: the base model a run needs, recorded; and, under LoRA, checkpoints without the frozen
    base (its weights are the pretrained model's, read again from ``name_or_path`` when the net is built), holding
    the adapters and whatever else trains (a classifier's head) with their optimizer state."""

    model: Any  # a transformers model, or peft's around it

    def __init__(
        self,
        name_or_path: str,
        lora: "LoRA | None" = None,
        gradient_checkpointing: bool = False,
        attn_implementation: str | None = None,
        dtype: Literal["float32", "bfloat16", "nf4"] = "float32",
        download: bool = False,
    ) -> None:
        """
        Args:
            name_or_path: a directory ``save_pretrained`` wrote, or a hub id in the local cache.
            lora: train LoRA adapters (and a classifier's new head) on a frozen base instead of every weight.
            gradient_checkpointing: recompute activations in the backward (less memory, ~30% more compute).
            attn_implementation: transformers' ``eager``, ``sdpa`` (its default where supported), ...
            dtype: the weights as loaded: float32 (full fine-tuning; on a GPU with trainer.precision=bf16-mixed), or
                for the frozen base under LoRA bfloat16 (half its memory) or nf4 (QLoRA: 4-bit NormalFloat blocks
                computing in bfloat16, about a quarter; bitsandbytes); what trains stays float32.
            download: allow fetching ``name_or_path`` from the hub.
        """
        super().__init__()
        transformers_module()  # the hf extra, or one sentence saying how to install it
        self.name_or_path, self.lora, self.gradient_checkpointing = name_or_path, lora, gradient_checkpointing
        self.path = pretrained_path(name_or_path, "model.net.init_args.name_or_path", download)
        # How from_pretrained loads the model (and its tokenizer: local_files_only).
        self.loading: dict[str, Any] = {**_dtype(dtype, lora), "local_files_only": not download}
        self.quantized = dtype == "nf4"
        if attn_implementation:
            self.loading["attn_implementation"] = attn_implementation

    def _adopt(self, model: Any, task_type: str) -> None:
        """``model`` as this net's, checkpointed and wrapped as the arguments say, in train mode."""
        if self.gradient_checkpointing:  # non-reentrant: reentrant checkpointing breaks under DDP with LoRA (peft #313)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.quantized:  # peft's QLoRA preparation: norms and embeddings in float32, inputs that need grads
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=self.gradient_checkpointing)
        self.model = _with_lora(model, self.lora, task_type) if self.lora is not None else model
        # from_pretrained leaves the model in eval mode, and Lightning keeps each submodule's mode: dropout (and
        # LoRA's) would stay off for the whole run (Lightning #20105).
        self.model.train()
        self.register_load_state_dict_post_hook(_frozen_are_not_missing)

    @property
    def vocab_size(self) -> int:
        """The token ids the model embeds (the data's tokenizer must have no more)."""
        return int(self.model.get_input_embeddings().num_embeddings)

    @property
    def vocabulary(self) -> list[str] | None:
        """The model's own tokenizer's tokens by id (None where its directory has no tokenizer): the data's must be
        the same."""
        if not hasattr(self, "_vocabulary"):
            tokenizer = getattr(self, "tokenizer", None)
            if tokenizer is None:
                try:
                    tokenizer = transformers_module().AutoTokenizer.from_pretrained(
                        self.path, local_files_only=self.loading["local_files_only"]
                    )
                except (OSError, ValueError):
                    tokenizer = None
            self._vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if tokenizer else None
        return self._vocabulary

    def shard_units(self) -> list[nn.Module]:
        """What FSDP shards as one unit (configs/fsdp.yaml): the blocks the model names in ``_no_split_modules``
        (a decoder or encoder layer; without such names, the items of its layer lists), so that tied weights (the
        embeddings and the output layer) stay together in the whole net's unit."""
        if names := set(getattr(self.model, "_no_split_modules", None) or []):
            return [m for m in self.model.modules() if type(m).__name__ in names]
        return [block for m in self.model.modules() if isinstance(m, nn.ModuleList) for block in m]

    def frozen_names(self) -> set[str]:
        return {name for name, p in self.named_parameters() if not p.requires_grad}

    def state_dict(self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Any:
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        frozen = self.frozen_names()
        for key in [k for k in state if k.startswith(prefix)]:
            # A frozen weight, and what a 4-bit one keeps beside it (<weight>.absmax, <weight>.quant_state...).
            parts = key[len(prefix) :].split(".")
            if any(".".join(parts[:i]) in frozen for i in range(1, len(parts) + 1)):
                del state[key]
        return state

    def load_pretrained(self) -> dict[str, Any]:
        """Which base model a fresh run starts from (read when the net was built), for the run's provenance.json:
        the path or hub id, and the hub's revision (a cached model's folder is named by it) or else a hash of the
        weight files (reading them once more: about a second per GB)."""
        record = {"name_or_path": self.name_or_path, "path": str(self.path)}
        path = Path(self.path)
        if path.parent.name == "snapshots":  # the Hugging Face cache: .../snapshots/<commit of the model's repo>
            return {**record, "revision": path.name}
        digest = hashlib.sha256()
        for weights in sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin")):
            with open(weights, "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
        return {**record, "weights_sha256": digest.hexdigest()}


def _dtype(name: str, lora: "LoRA | None") -> dict[str, Any]:
    """from_pretrained's arguments for the weights as ``dtype`` names them."""
    if name != "float32" and lora is None:
        raise ConfigError(
            f"model.net.init_args.dtype={name} is for a frozen base under LoRA: full fine-tuning keeps float32 "
            "weights (with trainer.precision=bf16-mixed to compute in bfloat16 on a GPU)."
        )
    if name != "nf4":
        return {"dtype": {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]}
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError(
            "model.net.init_args.dtype=nf4 (QLoRA) needs bitsandbytes: make install EXTRAS=hf,qlora."
        ) from None
    quantization = transformers_module().BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    return {"dtype": torch.bfloat16, "quantization_config": quantization}


def _floating_inputs_in_float32(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.float() if isinstance(a, Tensor) and a.dtype == torch.bfloat16 else a for a in args)


def _float(logits: Tensor) -> Tensor:
    """Logits of a bfloat16 base in float32, for the loss (a float64 model's stay float64)."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def _frozen_are_not_missing(net: nn.Module, incompatible: Any) -> None:
    """Loading a checkpoint: the frozen base's weights are absent by design (``_Pretrained``), any other is not."""
    frozen = net.frozen_names()  # type: ignore[operator]
    incompatible.missing_keys[:] = [
        k for k in incompatible.missing_keys if not any(k == n or k.endswith(f".{n}") for n in frozen)
    ]


class HFClassifier(_Pretrained):
    """``AutoModelForSequenceClassification`` from ``name_or_path`` with a new head of ``num_outputs`` classes:
    token ids in (padding with the tokenizer's pad id, masked out), logits out."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, name_or_path: str, **pretrained: Any) -> None:
        """
        Args:
            input_shape: (max_length,), linked from the data.
            num_outputs: the classes (or tags), linked from the data.
            name_or_path: a directory ``save_pretrained`` wrote, or a hub id in the local cache.
            **pretrained: how it is loaded and trained (``lora``, ``dtype``, ...: see ``_Pretrained``).
        """
        super().__init__(name_or_path, **pretrained)
        model = transformers_module().AutoModelForSequenceClassification.from_pretrained(
            self.path, num_labels=num_outputs, ignore_mismatched_sizes=True, **self.loading
        )
        self.pad_id = model.config.pad_token_id
        self._adopt(model, "SEQ_CLS")

    def forward(self, ids: Tensor) -> Tensor:
        return _float(self.model(input_ids=ids, attention_mask=(ids != self.pad_id).long(), use_cache=False).logits)


class HFCausalLM(_Pretrained):
    """``AutoModelForCausalLM`` from ``name_or_path``: token ids (batch, T) in, next-token logits (batch, T, vocabulary)
    out. No attention mask: padding comes after every real token and the model is causal, so no real token sees it
    (and many chat models pad with their end-of-turn token, which a mask made from the pad id would hide). Generation
    is the model's own ``generate`` (its KV cache), the tokenizer's decode its."""

    # transformers computes RMSNorm, RoPE and softmax in float32 even in a float64 model: equivalences hold to
    # float32's rounding there (the contract suite's tolerance), not float64's.
    float32_inside = True

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, name_or_path: str, **pretrained: Any) -> None:
        """
        Args:
            input_shape: (max_length,), linked from the data.
            num_outputs: the tokenizer's vocabulary, linked from the data (the embeddings grow if it is larger).
            name_or_path: a directory ``save_pretrained`` wrote, or a hub id in the local cache.
            **pretrained: how it is loaded and trained (``lora``, ``dtype``, ...: see ``_Pretrained``).
        """
        super().__init__(name_or_path, **pretrained)
        model = transformers_module().AutoModelForCausalLM.from_pretrained(self.path, **self.loading)
        self.tokenizer = transformers_module().AutoTokenizer.from_pretrained(
            self.path, local_files_only=self.loading["local_files_only"]
        )
        if num_outputs > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(num_outputs)
        self._adopt(model, "CAUSAL_LM")

    def forward(self, ids: Tensor) -> Tensor:
        if ids.ndim == 3:  # packed sequences (batch, 2, T): the ids over their positions, which restart per sequence
            ids, positions = ids.unbind(1)
            return _float(self.model(input_ids=ids, position_ids=positions, use_cache=False).logits)
        return _float(self.model(input_ids=ids, use_cache=False).logits)

    @torch.no_grad()
    def generate(self, ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None, seed: int) -> Tensor:
        """``max_new_tokens`` ids after the prompt ``ids`` (1, T), sampled as the task says (temperature 0: greedy),
        padded with the end-of-turn id after the model stops."""
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": top_k or 0}
            if temperature > 0
            else {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
        )
        stop = self.stop_ids[0]
        with torch.random.fork_rng(devices=[ids.device] if ids.is_cuda else []):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                pad_token_id=stop,
                **sampling,
            )
        new = out[:, ids.shape[1] :]
        return nn.functional.pad(new, (0, max_new_tokens - new.shape[1]), value=stop)

    @property
    def stop_ids(self) -> list[int]:
        """The ids generation stops at (the end of a turn), as the model's generation config names them."""
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        return list(eos) if isinstance(eos, list | tuple) else [int(eos)]

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def _with_lora(model: nn.Module, lora: LoRA, task_type: str) -> nn.Module:
    """peft's LoRA around ``model``: the base frozen, the adapters (and ``modules_to_save``) trained."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        task_type=task_type,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        modules_to_save=lora.modules_to_save or None,
    )
    with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        wrapped = get_peft_model(model, config)
    for param in wrapped.parameters():  # what trains in float32 (a classifier's head is a copy of a bfloat16 base's)
        if param.requires_grad:
            param.data = param.data.float()
    for module in wrapped.modules():  # and a bfloat16 base's features reach those modules in float32
        if type(module).__name__ == "ModulesToSaveWrapper":
            module.register_forward_pre_hook(_floating_inputs_in_float32)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    total = sum(p.numel() for p in wrapped.parameters())
    print(f"LoRA: {trainable:,} of {total:,} parameters train ({100 * trainable / total:.2f}%)")
    return wrapped


def save_pretrained(run: str | Path, out: str | Path | None = None) -> Path:
    """A run's best checkpoint as transformers directories under ``out`` (default: ``<run>/hf``): ``model`` (the
    whole fine-tuned model; under LoRA the merged one) and, under LoRA, ``adapter`` (the adapter alone, for peft's
    ``PeftModel.from_pretrained`` on the base); each with the tokenizer and the class names in its config."""
    from project.engine import load_run

    run = Path(run)
    model, data = load_run(run / "checkpoints" / "best.ckpt", read_data=False)
    net = model.net
    if not isinstance(net, HFClassifier | HFCausalLM):
        raise ConfigError(f"{run}: its net is {type(net).__name__}, not a project.hf model.")
    out = Path(out) if out is not None else run / "hf"
    hf_model = net.model
    if hasattr(hf_model, "merge_and_unload"):  # LoRA: the adapter alone, then the base with the adapter merged in
        base = Path(net.name_or_path)  # a directory as an absolute path: the adapter loads from anywhere
        hf_model.peft_config["default"].base_model_name_or_path = str(base.resolve()) if base.is_dir() else str(base)
        hf_model.save_pretrained(out / "adapter")
        if net.quantized:  # merged into the base reloaded in bfloat16, not into its 4-bit blocks (QLoRA's way)
            from peft import PeftModel

            auto = (
                transformers_module().AutoModelForSequenceClassification
                if isinstance(net, HFClassifier)
                else (transformers_module().AutoModelForCausalLM)
            )
            labels = {"num_labels": len(data.target_names)} if isinstance(net, HFClassifier) else {}
            reloaded = auto.from_pretrained(net.path, dtype=torch.bfloat16, local_files_only=True, **labels)
            hf_model = PeftModel.from_pretrained(reloaded, out / "adapter")
        hf_model = hf_model.merge_and_unload()
    if isinstance(net, HFClassifier):
        names = list(data.target_names)
        hf_model.config.id2label = dict(enumerate(names))
        hf_model.config.label2id = {name: i for i, name in enumerate(names)}
        multi = data.target_kind == "values"  # a 0/1 value per tag: transformers' loss is then the tags' BCE
        hf_model.config.problem_type = "multi_label_classification" if multi else "single_label_classification"
    hf_model.save_pretrained(out / "model")
    tokenizer = net.tokenizer if isinstance(net, HFCausalLM) else data.tokenizer_object()
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
