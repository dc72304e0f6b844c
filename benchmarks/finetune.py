"""`make bench`'s fine-tuning workload: SFT of a pretrained causal LM (``configs/tasks/sft.yaml``) by the template,
against a plain transformers + PyTorch loop doing the same work, and full fine-tuning against LoRA and QLoRA.

A small Llama (random weights, a byte-level BPE learned from the chats: ``make example-data``'s recipe, wider) and
the example chats are written to a scratch folder. Each run is a fresh process, the runs alternating:
- ``template``: ``fit`` as the CLI builds it from configs/default.yaml + configs/tasks/sft.yaml (every default
  callback, the logger, the token weighting), validating one batch at the end;
- ``loop``: the same model, chats (the DataModule's tokenised train split, in the same seeded order, padded the same
  way), AdamW over the same two parameter groups, warmup+cosine per step and clipping at 1.0, the loss as the task
  computes it (the assistant's token losses summed, over their count), written as a plain loop;
- ``lora``: the template with LoRA adapters (r 8, every linear layer) on the frozen base;
- ``qlora``: the same on the base in 4 bits (``dtype: nf4``), where bitsandbytes is installed (the qlora extra).

Figures per run: the assistant's (counted) tokens per second over the steps after the first, the peak memory (the
process's resident set on a CPU; ``torch.cuda.max_memory_allocated`` on a GPU) and, on a GPU, the MFU by the 6N
estimate (6 x parameters FLOPs per input position, padding included, against the device's peak).

    python benchmarks/finetune.py [--steps 30] [--repeats 3] [--width 256] [--layers 4]
"""

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
SEED, LR, BATCH, MAX_LENGTH = 0, 3e-3, 8, 512
KINDS = ("loop", "template", "lora", "qlora")


def prepare(folder: Path, width: int, layers: int) -> tuple[Path, Path]:
    """The chats and the model, as ``make example-data`` writes them (the model wider and deeper)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_example_data import write_chats, write_tiny_chat_model
    from transformers.utils import logging

    logging.disable_progress_bar()  # save_pretrained's

    chats = write_chats(folder / "chats.jsonl")
    model = write_tiny_chat_model(folder / "model", chats.read_text().splitlines(), width=width, layers=layers)
    return chats, model


def _args(chats: Path, model: Path, steps: int, kind: str) -> list[str]:
    return [
        "--config", str(ROOT / "configs" / "default.yaml"), "--config", str(ROOT / "configs" / "tasks" / "sft.yaml"),
        f"--data.path={chats}", f"--data.tokenizer={model}", f"--model.net.init_args.name_or_path={model}",
        f"--data.max_length={MAX_LENGTH}", f"--data.batch_size={BATCH}", f"--seed_everything={SEED}",
        f"--model.optimizer.init_args.lr={LR}", f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=1",
        f"--trainer.logger.init_args.save_dir={chats.parent / 'logs'}",
        *(["--model.net.init_args.lora={r: 8, alpha: 16, target_modules: all-linear}"] if "lora" in kind else []),
        *(["--model.net.init_args.dtype=nf4"] if kind == "qlora" else []),
    ]  # fmt: skip


def _figures(ends: list[float], tokens: list[int], positions: list[int], parameters: int) -> dict[str, Any]:
    """Per step: its end, its counted tokens, its input positions (padding included). Counted tokens per second over
    the steps after the first (which warms caches) but the last (the template validates after it), peak memory, MFU."""
    ends, tokens, positions = ends[:-1], tokens[:-1], positions[:-1]
    elapsed = ends[-1] - ends[0]
    steady = sum(tokens[1:]) / elapsed
    figures: dict[str, Any] = {"tokens_per_sec": steady, "timed_steps": len(ends) - 1,
                               "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip
    if torch.cuda.is_available():
        from lightning.fabric.utilities.throughput import get_available_flops

        peak = get_available_flops(torch.device("cuda"), torch.float32)
        figures["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        figures["mfu"] = 6 * parameters * sum(positions[1:]) / elapsed / peak if peak else None
    return figures


def run_template(chats: Path, model: Path, steps: int, kind: str) -> dict[str, Any]:
    import lightning as L

    from project.engine import CLI, IGNORE_INDEX

    ends: list[float] = []
    tokens: list[int] = []
    positions: list[int] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            tokens.append(int((batch[1] != IGNORE_INDEX).sum()))  # a host sync: the step is done (the loop's too)
            positions.append(batch[1].numel())
            ends.append(time.perf_counter())

    cli = CLI(_args(chats, model, steps, kind), run=False)
    cli.trainer.callbacks.append(Clock())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    parameters = sum(p.numel() for p in cli.model.parameters())
    return _figures(ends, tokens, positions, parameters)


def run_loop(chats: Path, model_path: Path, steps: int) -> dict[str, Any]:
    """The plain loop; the DataModule only tokenises and pads (what is compared is the training)."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import AutoModelForCausalLM

    from project.data import ChatDataModule
    from project.engine import IGNORE_INDEX, resolve_warmup_steps
    from project.recipe import WarmupCosine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = ChatDataModule(path=str(chats), tokenizer=str(model_path), max_length=MAX_LENGTH, batch_size=BATCH)
    data.setup("fit")
    torch.use_deterministic_algorithms(True)  # configs/default.yaml's trainer.deterministic
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).train()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2]}, {"params": [p for p in params if p.ndim < 2]}]
    optimizer = torch.optim.AdamW(groups, lr=LR, weight_decay=0.0)  # configs/tasks/sft.yaml's
    schedule = WarmupCosine(optimizer, steps, resolve_warmup_steps(0.03, steps), min_lr=1e-5)
    sampler = DistributedSampler(data.train_set, num_replicas=1, rank=0, shuffle=True, seed=SEED, drop_last=True)
    loader = DataLoader(data.train_set, batch_size=BATCH, sampler=sampler, collate_fn=data.collate_fn)
    ends, tokens, positions = [], [], []
    for _, (x, y) in zip(range(steps), loader, strict=False):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(input_ids=x, use_cache=False).logits
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none", ignore_index=IGNORE_INDEX)
        counted = y != IGNORE_INDEX
        loss = losses.view_as(y).masked_fill(~counted, 0.0).sum() / counted.sum().clamp_min(1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        tokens.append(int(counted.sum()))
        positions.append(y.numel())
        ends.append(time.perf_counter())
    return _figures(ends, tokens, positions, sum(p.numel() for p in params))


def workload(steps: int, repeats: int, width: int = 256, layers: int = 4) -> dict[str, Any]:
    """Every run, alternating, each in a fresh process; medians per kind and the ratios."""
    kinds = [k for k in KINDS if k != "qlora" or importlib.util.find_spec("bitsandbytes")]
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as scratch:
        chats, model = prepare(Path(scratch), width, layers)
        for _ in range(repeats):
            for kind in kinds:
                out = subprocess.run(
                    [sys.executable, __file__, "--one", kind, "--chats", str(chats), "--model", str(model),
                     "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True,
                )  # fmt: skip
                if out.returncode != 0:
                    raise SystemExit(f"finetune/{kind} failed:\n{out.stderr[-3000:]}")
                runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
               for kind, rs in runs.items()}  # fmt: skip
    loop, template, lora = (medians[k] for k in KINDS[:3])
    return {
        "model": {"width": width, "layers": layers}, "steps": steps, "repeats": repeats, "runs": runs,
        "medians": medians, "template_over_loop": template["tokens_per_sec"] / loop["tokens_per_sec"],
        "lora_over_full": lora["tokens_per_sec"] / template["tokens_per_sec"],
        "noise_pct": 100 * (max(r["tokens_per_sec"] for r in runs["loop"]) / min(r["tokens_per_sec"] for r in
                                                                                runs["loop"]) - 1),
    }  # fmt: skip


def report(row: dict[str, Any]) -> None:
    m = row["medians"]
    print(
        f"fine-tuning (SFT, a {row['model']['layers']}-layer Llama {row['model']['width']} wide, {row['steps']} "
        f"steps, {row['repeats']} runs each, fresh processes): the assistant's tokens per second, peak memory"
    )
    for kind in m:
        memory = f"{m[kind]['cuda_peak_mb']:.0f} MB on the GPU" if "cuda_peak_mb" in m[kind] else (
            f"{m[kind]['peak_rss_mb']:.0f} MB resident")  # fmt: skip
        mfu = f", MFU {100 * m[kind]['mfu']:.1f}%" if m[kind].get("mfu") else ""
        print(f"  {kind:9} {m[kind]['tokens_per_sec']:9.0f} tokens/s  {memory}{mfu}")
    noise = f"the loop's run-to-run spread {row['noise_pct']:.1f}%" if row["repeats"] > 1 else "one run each, unknown"
    print(f"  => template / plain loop {row['template_over_loop']:.3f}x; LoRA / full fine-tuning "
          f"{row['lora_over_full']:.2f}x tokens/s; noise: {noise}\n")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--chats", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one run, its figures as the last line of stdout
        chats, model = Path(args.chats), Path(args.model)
        if args.one == "loop":
            print(json.dumps(run_loop(chats, model, args.steps)))
        else:
            print(json.dumps(run_template(chats, model, args.steps, args.one)))
        return
    report(workload(args.steps, args.repeats, args.width, args.layers))


if __name__ == "__main__":
    main()
