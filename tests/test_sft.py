"""The SFT example (project/data/chat.py, project.hf.HFCausalLM, configs/tasks/sft.yaml): a pretrained causal LM
fine-tuned on chats with its own chat template, the loss on the assistant's tokens only. The model is a tiny Llama
with a byte-level BPE and a ChatML template (as Qwen's: no generation markers), built here (nothing is downloaded)."""

import csv
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import DIGITS, SFT, fit
from torch import Tensor

from project.engine import IGNORE_INDEX, ConfigError

pytest.importorskip("transformers", reason="the hf extra is not installed (make install EXTRAS=hf)")

CHAT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Spell apple backwards."},
    {"role": "assistant", "content": "elppa"},
    {"role": "user", "content": "Write river in capitals."},
    {"role": "assistant", "content": "RIVER"},
]


def _given(chats: Path, model: Path) -> tuple[str, ...]:
    return (f"--data.path={chats}", f"--data.tokenizer={model}", f"--model.net.init_args.name_or_path={model}")


@pytest.mark.guarantee(
    "SFT counts the assistant's tokens only, each answer's end-of-turn token included (so generation learns to "
    "stop), found for a chat template without generation markers; a chat left with no assistant token (truncated "
    "away) is refused in one sentence naming its row",
)
def test_only_the_assistants_tokens_count_with_their_end_of_turn(tiny_chat: Path) -> None:
    from transformers import AutoTokenizer

    from project.data.chat import tokenize_chat

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat)
    assert "{% generation %}" not in tokenizer.chat_template
    inputs, targets = tokenize_chat(tokenizer, CHAT, 512, "row 1")
    ids = [*inputs.tolist(), targets[-1].item()]  # the chat's ids: the inputs, then the last target
    assert ids == tokenizer(tokenizer.apply_chat_template(CHAT, tokenize=False), add_special_tokens=False)["input_ids"]
    counted = targets[targets != IGNORE_INDEX].tolist()
    assert tokenizer.decode(counted) == "elppa<|im_end|>\nRIVER<|im_end|>\n"
    with pytest.raises(ConfigError, match=r"^row 1: no assistant token is left to learn from .*max_length=8"):
        tokenize_chat(tokenizer, CHAT, 8, "row 1")  # the system and user turns alone fill the first 8 tokens


@pytest.mark.guarantee(
    "SFT's loss on a batch (padded chats of different lengths) is transformers' own `outputs.loss` on the same "
    "model and labels, to float32 rounding: the token-weighted mean over the assistant's tokens",
)
def test_the_loss_is_transformers_own_on_a_padded_batch(tiny_chat: Path, chats_jsonl: Path) -> None:
    from transformers import AutoModelForCausalLM

    from project.data import ChatDataModule
    from project.hf import HFCausalLM
    from project.tasks import LanguageModel

    data = ChatDataModule(path=str(chats_jsonl), tokenizer=str(tiny_chat), max_length=64)
    samples = [data.load_dataset()[i] for i in range(6)]
    x, y = data.collate_fn(samples)
    assert len({len(s[0]) for s in samples}) > 1 and (y == IGNORE_INDEX).any()
    task = LanguageModel(net=HFCausalLM((64,), len(data.vocabulary), str(tiny_chat)), target_names=data.vocabulary)
    reference = AutoModelForCausalLM.from_pretrained(tiny_chat, dtype=torch.float32).eval()
    with torch.no_grad():
        losses = task.eval().loss(task(x), y)
        ours = losses[y != IGNORE_INDEX].sum() / (y != IGNORE_INDEX).sum()  # the token-weighted mean the engine takes
        # transformers shifts the labels itself: position t is scored against label t + 1.
        ids = F.pad(x, (0, 1), value=data.pad_id)
        labels = F.pad(y, (1, 0), value=IGNORE_INDEX)
        theirs = reference(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.guarantee(
    "SFT through the CLI learns the chats (the validation loss falls), greedy predict on prompts answers as "
    "transformers' own `generate` does with the same weights, and the export loads back into transformers with "
    "the run's logits",
)
@pytest.mark.slow
def test_sft_learns_predicts_as_transformers_generates_and_exports(
    tiny_chat: Path, chats_jsonl: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from project.engine import load_run, main
    from project.hf import save_pretrained

    cli = fit(tmp_path, *_given(chats_jsonl, tiny_chat), "--trainer.max_epochs=3", configs=(DIGITS, SFT))
    run = Path(cli.trainer.log_dir)
    # A model that has learnt nothing scores ln(vocabulary) per token (random weights: about that): half of it.
    best = float(cli.trainer.checkpoint_callback.best_model_score)
    assert best < 0.5 * math.log(len(cli.datamodule.vocabulary)), best
    prompts = ["Spell tiger backwards.", "How many letters are in planet?"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts))
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}",
          f"--data.predict_path={tmp_path / 'prompts.txt'}"])  # fmt: skip
    with open(run / "predictions.csv", newline="") as f:
        predicted = [row["generated"] for row in csv.DictReader(f)]
    model, data = load_run(run / "checkpoints" / "best.ckpt", read_data=False)
    hf_model, tokenizer = model.net.model.eval(), model.net.tokenizer
    for prompt, row in zip(prompts, predicted, strict=True):
        ids = data.prompt_ids(prompt)[None]
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert row == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), (row, prompt)
    out = save_pretrained(run)
    reloaded = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32).eval()
    x = data.prompt_ids(prompts[0])[None]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=x).logits, model.eval()(x), rtol=1e-5, atol=1e-6)


@pytest.mark.engine
@pytest.mark.guarantee(
    "SFT on 2 DDP processes x 4 chats gets the gradient of 1 process x 8 (every optimizer step: the assistant's "
    "tokens weigh the same whichever process holds them, the prompts' masked tokens count for nothing), to the "
    "float32 rounding transformers' norms and RoPE bound",
)
@pytest.mark.slow
def test_two_processes_get_the_one_process_gradient_on_chats(
    tiny_chat: Path, chats_jsonl: Path, tmp_path: Path
) -> None:
    common = (*_given(chats_jsonl, tiny_chat), "--trainer.precision=64-true", "--trainer.max_steps=2",
              "--trainer.max_epochs=1", "--trainer.limit_val_batches=0", "--trainer.accelerator=cpu",
              "--trainer.callbacks+=probes.NoDropout", "--trainer.callbacks+=probes.Recorder",
              "--trainer.callbacks.keep_grads=true")  # fmt: skip
    single = fit(tmp_path / "one", *common, f"--trainer.callbacks.out_dir={tmp_path / 'one'}", "--data.batch_size=8",
                 configs=(DIGITS, SFT))  # fmt: skip
    assert single.trainer.global_step == 2
    # Chats of unequal lengths: the two processes hold unequal numbers of the assistant's tokens.
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=True)
    _assert_the_one_process_gradient(one, _on_two_processes("ddp.yaml", common, tmp_path / "two"))


def _on_two_processes(overlay: str, common: tuple[str, ...], out: Path, *more: str) -> list[dict]:
    """``fit`` over ``configs/<overlay>`` (DDP or FSDP) as 2 processes x 4 chats: each rank's ``probes.Recorder``."""
    from conftest import ROOT, run_ranks

    result = run_ranks("fit", "--config", DIGITS, "--config", SFT, "--config", str(ROOT / "configs" / overlay),
                        *common, "--data.batch_size=4", f"--trainer.logger.init_args.save_dir={out}",
                        f"--trainer.callbacks.out_dir={out}", *more, cwd=Path.cwd())  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def _assert_the_one_process_gradient(one: dict, ranks: list[dict]) -> None:
    """Every optimizer step: the two ranks' batches are the one process's, and each rank holds its gradient."""
    for step, batch in enumerate(one["batches"]):
        assert sorted(batch) == sorted(ranks[0]["batches"][step] + ranks[1]["batches"][step])
        expected = one["grads"][step]
        for rank in ranks:  # the reduced (or gathered) gradient: float32 rounding inside, as in accumulation
            torch.testing.assert_close(rank["grads"][step], expected, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.guarantee(
    "a chat row that is not one is refused in one sentence naming its row and turn: a turn without text (missing or "
    "null), a role that is none of system/user/assistant/tool, an empty answer; never a traceback, never a silent "
    "'None' learnt as an answer",
)
def test_a_malformed_chat_is_refused_naming_its_row_and_turn() -> None:
    from project.data.chat import messages_of

    user = {"role": "user", "content": "Spell apple backwards."}
    bad = [
        ("turn 2: .* is not a turn", {"messages": [user, {"role": "assistant"}]}),
        ("turn 2: .*null.* is not a turn", {"messages": [user, {"role": "assistant", "content": None}]}),
        ("turn 2: .*asistant.* is not a turn", {"messages": [user, {"role": "asistant", "content": "elppa"}]}),
        ("turn 2: an empty answer", {"messages": [user, {"role": "assistant", "content": " "}]}),
        ("turn 2: .*null.* is not a turn", {"prompt": "Spell apple backwards.", "completion": None}),
    ]
    for pattern, row in bad:
        with pytest.raises(ConfigError, match=rf"^row 7, {pattern}"):
            messages_of(row, "row 7")
    assert messages_of({"prompt": "p", "completion": "c"}, "row 1") == [
        {"role": "user", "content": "p"}, {"role": "assistant", "content": "c"}]  # fmt: skip


@pytest.mark.guarantee(
    "SFT's first optimizer steps are a plain transformers + PyTorch loop's, bitwise: from the same pretrained model "
    "and chats in the same seeded order, with the loss as the task computes it (the assistant's summed token losses "
    "times one over their count), AdamW, the warmup+cosine LR per step and clipping at 1.0, every weight is equal",
)
@pytest.mark.slow
def test_the_first_steps_are_a_plain_transformers_loops_bitwise(
    tiny_chat: Path, chats_jsonl: Path, tmp_path: Path
) -> None:
    from torch.utils.data import DataLoader, DistributedSampler
    from transformers import AutoModelForCausalLM

    from project.engine import resolve_warmup_steps
    from project.recipe import WarmupCosine

    steps, seed = 4, 42  # seed: seed_everything in tests/configs/digits.yaml
    cli = fit(tmp_path, *_given(chats_jsonl, tiny_chat), f"--trainer.max_steps={steps}", configs=(DIGITS, SFT))
    assert cli.trainer.global_step == steps
    template = cli.model.net.model.state_dict()  # the best checkpoint's, which the final test loaded: step 4's

    # The loop: transformers' model and torch's sampler, optimizer, schedule and clipping; the DataModule's
    # tokenised chats and padding (what is compared is the training, not the tokenisation).
    torch.use_deterministic_algorithms(True)  # trainer.deterministic
    torch.manual_seed(seed)
    data = cli.datamodule
    model = AutoModelForCausalLM.from_pretrained(tiny_chat, dtype=torch.float32).train()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2]}, {"params": [p for p in params if p.ndim < 2]}]
    optimizer = torch.optim.AdamW(groups, lr=0.005, weight_decay=0.0)  # tests/configs/sft.yaml
    schedule = WarmupCosine(optimizer, steps, resolve_warmup_steps(0.05, steps), min_lr=1e-5)  # digits.yaml's
    sampler = DistributedSampler(data.train_set, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(data.train_set, batch_size=8, sampler=sampler, collate_fn=data.collate_fn)
    for _, (x, y) in zip(range(steps), loader, strict=False):
        logits = model(input_ids=x, use_cache=False).logits
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none", ignore_index=IGNORE_INDEX)
        loss = losses.view_as(y).masked_fill(y == IGNORE_INDEX, 0.0).sum()
        loss = loss * (1 / (y != IGNORE_INDEX).sum().clamp_min(1).double()).float()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
        optimizer.step()
        schedule.step()
    torch.use_deterministic_algorithms(False)
    plain = model.state_dict()
    assert template.keys() == plain.keys()
    differ = [k for k in plain if not torch.equal(template[k], plain[k])]
    assert not differ, f"{len(differ)} of {len(plain)} tensors differ, e.g. {differ[:3]}"


@pytest.mark.guarantee(
    "fine-tuning starts from the pretrained weights: SFT from a model pretrained (here, in the test) on other chats "
    "of the kind reaches a lower held-out loss than the same model from its untrained weights, on the same budget",
)
@pytest.mark.slow
def test_fine_tuning_a_pretrained_model_beats_the_same_model_from_scratch(
    tiny_chat: Path, chats_jsonl: Path, tmp_path: Path
) -> None:
    import json

    from make_example_data import write_chats
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Pretraining, nanoGPT's way: next-token loss on random 64-token windows of other chats' text, every token.
    tokenizer = AutoTokenizer.from_pretrained(tiny_chat)
    other = write_chats(tmp_path / "other.jsonl", seed=1)
    chats = [json.loads(line)["messages"] for line in other.read_text().splitlines()]
    stream = torch.tensor(tokenizer("".join(tokenizer.apply_chat_template(c, tokenize=False) for c in chats),
                                    add_special_tokens=False)["input_ids"])  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_chat, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(100):
        starts = torch.randint(len(stream) - 65, (16,))
        window = torch.stack([stream[s : s + 65] for s in starts.tolist()])
        loss = model(input_ids=window[:, :-1], labels=window[:, :-1]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    pretrained = tmp_path / "pretrained"
    model.save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)

    def best_val_loss(start: Path, name: str) -> float:
        given = (f"--data.path={chats_jsonl}", f"--data.tokenizer={tiny_chat}",
                 f"--model.net.init_args.name_or_path={start}", "--trainer.max_steps=10")  # fmt: skip
        cli = fit(tmp_path / name, *given, configs=(DIGITS, SFT))
        return float(cli.trainer.checkpoint_callback.best_model_score)

    scratch, tuned = best_val_loss(tiny_chat, "scratch"), best_val_loss(pretrained, "tuned")
    # Seen: 1.4 against 5.0 nats per token (ln of the vocabulary, an untrained model's, is about 6): a model that
    # kept its untrained weights would score as the scratch one does, give or take the seeds.
    assert tuned < 0.5 * scratch, (tuned, scratch)


@pytest.mark.guarantee(
    "QLoRA (`dtype: nf4`: LoRA on a base loaded in 4 bits by bitsandbytes): the base's linear layers hold 4-bit "
    "blocks, only the adapters train and are checkpointed, and the export merges the adapter into the base "
    "reloaded in bfloat16, whose logits are peft's adapter on that base to bfloat16 rounding; without LoRA it is "
    "refused",
)
@pytest.mark.slow
@pytest.mark.minimum  # the qlora extra's bound: make test-minimum runs it
def test_qlora_trains_adapters_on_a_4bit_base_and_merges_into_a_bfloat16_reload(
    chats_jsonl: Path, tmp_path: Path
) -> None:
    bnb = pytest.importorskip("bitsandbytes", reason="the qlora extra is not installed (make install EXTRAS=hf,qlora)")
    from make_example_data import write_tiny_chat_model
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from project.hf import HFCausalLM, save_pretrained

    # 128 wide: bitsandbytes quantizes blocks of 64 weights along a layer's inputs.
    wide = write_tiny_chat_model(tmp_path / "wide-chat", chats_jsonl.read_text().splitlines(), width=128)
    with pytest.raises(ConfigError, match=r"dtype=nf4 is for a frozen base under LoRA"):
        HFCausalLM((64,), 10, str(wide), dtype="nf4")
    lora = "--model.net.init_args.lora={r: 8, alpha: 16, target_modules: all-linear}"
    cli = fit(tmp_path, *_given(chats_jsonl, wide), lora, "--model.net.init_args.dtype=nf4", "--trainer.max_steps=6",
              configs=(DIGITS, SFT))  # fmt: skip
    quantized = [m for m in cli.model.net.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized and all(m.weight.dtype == torch.uint8 for m in quantized)  # two 4-bit weights per byte
    run = Path(cli.trainer.log_dir)
    saved = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved), sorted(saved)[:5]

    out = save_pretrained(run)
    merged = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    assert merged.dtype == torch.bfloat16 and not any(isinstance(m, bnb.nn.Linear4bit) for m in merged.modules())
    base = AutoModelForCausalLM.from_pretrained(wide, dtype=torch.bfloat16).eval()
    x = cli.datamodule.prompt_ids("Spell tiger backwards.")[None]
    with torch.no_grad():
        without = base(input_ids=x).logits.float()
        adapted = PeftModel.from_pretrained(base, out / "adapter").eval()(input_ids=x).logits.float()
        theirs = merged(input_ids=x).logits.float()
    # bfloat16 keeps 8 significant bits: each merged weight, and each product and sum after it, rounds by up to 2^-8
    # of its size; through two layers that stays within a few percent of the logits' scale.
    scale = adapted.abs().max()
    torch.testing.assert_close(theirs, adapted, rtol=0, atol=float(2**-5 * scale))
    assert (adapted - without).abs().max() > 2**-3 * scale  # and the adapter matters more than that rounding


@pytest.mark.engine
@pytest.mark.guarantee(
    "full fine-tuning of a Hugging Face model under FSDP2 (configs/fsdp.yaml) shards the blocks the model names "
    "(`_no_split_modules`) and keeps tied embeddings whole: 2 processes x 4 chats get the gradient of 1 process x 8 "
    "at every optimizer step, to float32 rounding",
)
@pytest.mark.slow
def test_fsdp_shards_the_models_blocks_and_two_processes_get_the_one_process_gradient(
    chats_jsonl: Path, tmp_path: Path
) -> None:
    from make_example_data import write_tiny_chat_model

    tied = write_tiny_chat_model(tmp_path / "tied-chat", chats_jsonl.read_text().splitlines(), tied=True)
    common = (*_given(chats_jsonl, tied), "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
              "--trainer.accelerator=cpu", "--trainer.callbacks+=probes.Recorder",
              "--trainer.callbacks.keep_grads=true")  # fmt: skip
    single = fit(tmp_path / "one", *common, f"--trainer.callbacks.out_dir={tmp_path / 'one'}", "--data.batch_size=8",
                 configs=(DIGITS, SFT))  # fmt: skip
    assert single.trainer.global_step == 2
    assert single.model.net.model.lm_head.weight is single.model.net.model.model.embed_tokens.weight  # tied
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=True)
    _assert_the_one_process_gradient(one, _on_two_processes("fsdp.yaml", common, tmp_path / "two"))
    # In bf16: the gathered weights compute in bfloat16 (FSDP's mixed-precision policy), the gradient is the same.
    half = _on_two_processes("fsdp.yaml", common, tmp_path / "bf16", "--trainer.precision=bf16-mixed",
                             "--trainer.callbacks+=probes.WeightDtypeInForward",
                             f"--trainer.callbacks.out={tmp_path / 'dtype.txt'}")[0]["grads"][0]  # fmt: skip
    assert (tmp_path / "dtype.txt").read_text() == "torch.bfloat16"  # not float32 under autocast alone
    # The first step's gradient from the same weights and batch: bfloat16 keeps 8 significant bits (2^-8 relative
    # per rounding, a few dozen in sequence): within a few percent of the gradient's scale.
    expected = one["grads"][0]
    torch.testing.assert_close(half, expected, rtol=0, atol=2**-4 * expected.abs().max().item())


@pytest.mark.guarantee(
    "packed chats (data.pack) are computed as if alone: in a block of several chats each position's logits are that "
    "chat's own, in train and eval mode (positions restart per chat and no token attends to another chat's), so a "
    "packed batch's token-weighted loss and gradient are those of the same chats unpacked, to float32 rounding",
)
def test_packed_chats_are_computed_as_if_alone(tiny_chat: Path, chats_jsonl: Path) -> None:
    from project.data import ChatDataModule
    from project.data.chat import pack_chats
    from project.hf import HFCausalLM
    from project.tasks import LanguageModel

    data = ChatDataModule(path=str(chats_jsonl), tokenizer=str(tiny_chat), max_length=64, pack=True, batch_size=2)
    chats = [data.load_dataset()[i] for i in range(8)]
    blocks = pack_chats(chats, 64)
    assert len(blocks) < len(chats) and all(b[0].shape[1] <= 64 for b in blocks)
    torch.manual_seed(0)
    task = LanguageModel(net=HFCausalLM((64,), len(data.vocabulary), str(tiny_chat)), target_names=data.vocabulary)
    packed_x, packed_y = data.collate_fn(blocks)
    assert packed_x.shape[:2] == (len(blocks), 2)
    for training in (True, False):
        task.train(training)
        with torch.no_grad():
            packed = task(packed_x)
            alone = [task(x[None])[0] for x, _ in chats]
        start, block = 0, 0
        for x, logits in zip([x for x, _ in chats], alone, strict=True):
            if start + len(x) > blocks[block][0].shape[1]:
                start, block = 0, block + 1
            # The same sums as the chat alone, over fewer or more masked-out keys (exact zeros): float32 rounding
            # of the matmuls' different shapes, a few ulps of the logits' scale.
            torch.testing.assert_close(packed[block, start : start + len(x)], logits, rtol=1e-5, atol=1e-5)
            start += len(x)

    def loss_and_grads(x: Tensor, y: Tensor) -> tuple[Tensor, list[Tensor]]:
        task.zero_grad()
        counted = y != IGNORE_INDEX
        loss = task.loss(task(x), y).masked_fill(~counted, 0.0).sum() / counted.sum()  # the engine's token weighting
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in task.parameters() if p.grad is not None]

    task.train()
    unpacked_loss, unpacked = loss_and_grads(*data.collate_fn(chats))
    packed_loss, grads = loss_and_grads(packed_x, packed_y)
    torch.testing.assert_close(packed_loss, unpacked_loss, rtol=1e-6, atol=0)
    for got, expected in zip(grads, unpacked, strict=True):  # sums over a few hundred tokens in another order
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    data.setup("fit")  # the DataModule serves the training chats packed, the validation chats alone
    assert next(iter(data.train_dataloader()))[0].shape[:2] == (2, 2)
    assert next(iter(data.val_dataloader()))[0].ndim == 2


@pytest.mark.guarantee(
    "chats are tokenised once: a later run on the same chats, tokenizer and max_length reads them back from the "
    "cache beside the file, equal to tokenising them again; other chats or another max_length are tokenised anew",
)
def test_tokenised_chats_are_read_back_from_the_cache_beside_the_file(
    tiny_chat: Path, chats_jsonl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import shutil

    from project.data import ChatDataModule, chat

    path = tmp_path / "chats.jsonl"
    shutil.copy(chats_jsonl, path)

    def chats(max_length: int = 64) -> list[tuple[Tensor, Tensor]]:
        dataset = ChatDataModule(path=str(path), tokenizer=str(tiny_chat), max_length=max_length).load_dataset()
        return [dataset[i] for i in range(len(dataset))]

    first = chats()
    assert [p.name.startswith("chats-") for p in (tmp_path / ".cache").iterdir()] == [True]
    tokenised = []
    tokenize_chat = chat.tokenize_chat
    monkeypatch.setattr(chat, "tokenize_chat", lambda *args: tokenised.append(args) or tokenize_chat(*args))
    again = chats()
    assert not tokenised
    assert len(again) == len(first)
    assert all(
        torch.equal(a, b) for sample, kept in zip(first, again, strict=True) for a, b in zip(sample, kept, strict=True)
    )
    chats(max_length=128)
    assert len(tokenised) == len(first)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"prompt": "Spell cat backwards.", "completion": "tac"}) + "\n")
    chats()
    assert len(tokenised) == 2 * len(first) + 1
