"""Token-weighted training on variable-length sequences (Lightning #20350): the loss of an optimizer step is the
sum of its per-token losses over every micro-batch and every process, divided by the step's count of counted
tokens, so accumulation and DDP equal the big batch, and the short last window of an epoch too. Evaluation loss is
the exact token-weighted mean over a split. On the engine's own fixture (tests/tokens.py): sequences of 1 to 12
tokens, padded per batch."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import DIGITS, ROOT, TOKENS, fit, run_ranks, scalars, scratch_dir
from probes import Recorder, Snapshots
from tokens import TokenNet, VariableLengthTokens, pad

from project.engine import IGNORE_INDEX

pytestmark = pytest.mark.slow
# float64, no dropout, no clipping: runs equal in exact arithmetic differ only in summation order (~1e-16
# relative per op); 1e-10 leaves 10^5 for the depth of the sums. A per-micro-batch mean misweights tokens by
# O(1) factors here (batches of 2 to 20 tokens): 1e-2 or more.
FLOAT64 = ("--trainer.precision=64-true", "--trainer.max_epochs=1", "--trainer.limit_val_batches=0",
           "--trainer.gradient_clip_val=null", "--trainer.accelerator=cpu", "--data.num_workers=0")  # fmt: skip
RTOL, ATOL = 1e-10, 1e-12


def _recorded(save_dir: Path, *args: str) -> Recorder:
    cli = fit(save_dir, *FLOAT64, "--trainer.callbacks+=probes.Snapshots", "--trainer.callbacks+=probes.Recorder",
              "--trainer.callbacks.keep_grads=true", *args, configs=(DIGITS, TOKENS))  # fmt: skip
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder))


def _gradient_by_hand(start: dict[str, torch.Tensor], samples: list[int]) -> torch.Tensor:
    """The first step's gradient from the initial weights: the sum of the per-token cross-entropies of all the
    step's samples, divided by their number of tokens."""
    dm = VariableLengthTokens(train_samples=10)
    dm.setup("fit")
    net = TokenNet((12,), 11).double()
    net.load_state_dict({k.removeprefix("net."): v for k, v in start.items()})
    x, y = pad([dm.train_set[i] for i in samples])
    losses = F.cross_entropy(net(x).transpose(1, 2), y, reduction="none", ignore_index=IGNORE_INDEX)
    (losses.sum() / (y != IGNORE_INDEX).sum()).backward()
    return torch.cat([p.grad.flatten() for p in net.parameters()])


@pytest.mark.guarantee(
    "accumulation of variable-length token micro-batches = one big batch, the short last window included, and the "
    "first step's gradient = the closed form (sum of per-token losses / tokens), float64 to 1e-10; seen failing "
    "with per-micro-batch token means"
)
def test_accumulated_variable_length_micro_batches_equal_the_big_batch_and_the_closed_form(tmp_path: Path) -> None:
    # 10 training sequences: batches of 2 with 2 accumulated are windows [2, 2], [2, 2] and a short last one [2];
    # the big batch sees the same samples as [4], [4], [2].
    small = _recorded(tmp_path / "small", "--data.train_samples=10", "--data.batch_size=2",
                      "--trainer.accumulate_grad_batches=2")  # fmt: skip
    start = {k: v.clone() for k, v in Snapshots.taken["start"].items()}
    large = _recorded(tmp_path / "large", "--data.train_samples=10", "--data.batch_size=4")
    assert small.batch_sizes == [2, 2, 2, 2, 2] and large.batch_sizes == [4, 4, 2]
    assert [i for b in small.batches() for i in b] == [i for b in large.batches() for i in b]
    assert len(small.grads) == len(large.grads) == 3 and small.grads[0].dtype == torch.float64
    for step, (a, b) in enumerate(zip(small.grads, large.grads, strict=True)):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=f"gradient of step {step}")
    for name, value in large.final_state.items():
        torch.testing.assert_close(small.final_state[name], value, rtol=RTOL, atol=ATOL, msg=name)
    by_hand = _gradient_by_hand(start, large.batches()[0])
    torch.testing.assert_close(small.grads[0], by_hand, rtol=RTOL, atol=ATOL)
    # The bound bites: the mean of the two micro-batches' token means is another gradient.
    dm = VariableLengthTokens(train_samples=10)
    dm.setup("fit")
    first, second = (pad([dm.train_set[i] for i in b])[1] for b in small.batches()[:2])
    assert (first != IGNORE_INDEX).sum() != (second != IGNORE_INDEX).sum()  # the micro-batches differ in tokens


@pytest.mark.guarantee(
    "2 DDP processes with unequal token counts = 1 process on the combined batch: every step's gradient on every "
    "rank and the final weights, float64 to 1e-10; seen failing without the cross-process token count"
)
def test_two_processes_with_unequal_token_counts_equal_one_process(tmp_path: Path) -> None:
    common = (*FLOAT64, "--trainer.max_steps=3", "--trainer.callbacks+=probes.Recorder",
              "--trainer.callbacks.keep_grads=true")  # fmt: skip
    fit(tmp_path / "single", *common, f"--trainer.callbacks.out_dir={tmp_path / 'one'}", "--data.batch_size=4",
        configs=(DIGITS, TOKENS))  # fmt: skip
    ddp = run_ranks("fit", "--config", DIGITS, "--config", TOKENS, "--config", str(ROOT / "configs" / "ddp.yaml"),
                    *common, f"--trainer.logger.init_args.save_dir={tmp_path / 'ddp'}", "--data.batch_size=2",
                    f"--trainer.callbacks.out_dir={tmp_path / 'two'}", cwd=scratch_dir())  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / "two" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    dm = VariableLengthTokens()
    dm.setup("fit")
    unequal = 0
    for step, batch in enumerate(one["batches"]):
        assert sorted(batch) == sorted(ranks[0]["batches"][step] + ranks[1]["batches"][step])
        counts = [int((pad([dm.train_set[i] for i in r["batches"][step]])[1] != IGNORE_INDEX).sum()) for r in ranks]
        unequal += counts[0] != counts[1]
    assert unequal >= 2  # the processes' shares of tokens differ: a per-process mean would misweight them
    for step, grad in enumerate(one["grads"]):
        for rank in ranks:  # every process holds the same, reduced gradient
            torch.testing.assert_close(rank["grads"][step], grad, rtol=RTOL, atol=ATOL, msg=f"step {step}")
    for name, value in one["final_state"].items():
        torch.testing.assert_close(ranks[0]["final_state"][name], value, rtol=RTOL, atol=ATOL, msg=name)


@pytest.mark.guarantee(
    "the evaluation loss of a token task is the token-weighted mean over the split (padding left out: torchmetrics "
    "#3434 drops the weights)"
)
def test_the_evaluation_loss_is_the_token_weighted_mean_over_the_split(tmp_path: Path) -> None:
    cli = fit(tmp_path, *FLOAT64[:2], "--trainer.max_steps=2", "--data.batch_size=5", "--trainer.accelerator=cpu",
              "--trainer.limit_val_batches=1.0", configs=(DIGITS, TOKENS))  # fmt: skip
    dm, task = cli.datamodule, cli.model.eval()
    x, y = pad([dm.test_set[i] for i in range(len(dm.test_set))])
    with torch.no_grad():
        losses = F.cross_entropy(task(x).transpose(1, 2), y, reduction="none", ignore_index=IGNORE_INDEX)
    expected = (losses.sum() / (y != IGNORE_INDEX).sum()).item()
    # The metric's state is float32 (6e-8 relative per addition, ~75 tokens): 1e-6. Padding counted as tokens
    # (torchmetrics #3434) gives 75 / 100 of it.
    assert cli.trainer.callback_metrics["test/loss"].item() == pytest.approx(expected, rel=1e-6)
    # Its standard error, the sample (sequence) as the unit: a ratio estimate's, from each sequence's summed loss s
    # and its token count w. Its float32 sums of squares cancel in part (~1e-5 relative here): 1e-4.
    s, w = (losses * (y != IGNORE_INDEX)).sum(1), (y != IGNORE_INDEX).sum(1).double()
    n, mean = len(s), s.sum() / w.sum()
    se = ((n / (n - 1)) * ((s - mean * w) ** 2).sum()).sqrt() / w.sum()
    assert cli.trainer.callback_metrics["test/loss_se"].item() == pytest.approx(se.item(), rel=1e-4)


@pytest.mark.guarantee("tokens per second count no padding; FLOPs per batch are 3 x the forward's")
def test_throughput_is_counted_in_tokens_and_flops(tmp_path: Path) -> None:
    """Within a logging window the rates share one elapsed time, so their ratios are exact counts: tokens per sample
    of the window's batch (padding excluded), and FLOPs per batch (3 x its forward's, counted by hand here)."""
    from torch.utils.flop_counter import FlopCounterMode

    recorder = _recorded(tmp_path, "--trainer.max_steps=4", "--trainer.log_every_n_steps=1", "--data.batch_size=4")
    logged = scalars(tmp_path / "tokens" / "version_0")
    dm = VariableLengthTokens()
    dm.setup("fit")
    for step, batch in enumerate(recorder.batches()):
        x, y = pad([dm.train_set[i] for i in batch])
        tokens = int((y != IGNORE_INDEX).sum())
        rates = {tag: dict(logged[f"train/{tag}"])[step] for tag in ("tokens_per_sec", "samples_per_sec",
                                                                     "flops_per_sec", "batches_per_sec")}  # fmt: skip
        assert rates["tokens_per_sec"] / rates["samples_per_sec"] == pytest.approx(tokens / len(batch), rel=1e-6)
        net = TokenNet((12,), 11).double()
        with FlopCounterMode(display=False) as counter:
            net(x)
        if step == 0:
            flops = 3 * counter.get_total_flops()  # the first batch's, as the monitor counts it
        assert rates["flops_per_sec"] / rates["batches_per_sec"] == pytest.approx(flops, rel=1e-6)
