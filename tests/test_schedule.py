"""The LR schedules (project/recipe.py): each follows its closed form point by point, per group, across a resume."""

import itertools
import math

import pytest
import torch

from project.engine import ConfigError, build_optimizer, resolve_warmup_steps
from project.recipe import WarmupConstant, WarmupCosine, WarmupLinear, WarmupStableDecay

pytestmark = [
    pytest.mark.guarantee(
        "the LR used at every optimizer step is the warmup+cosine closed form (warmup as fraction and count, with "
        "accumulation, with `max_steps`), bitwise the default's; warmup+linear, constant after warmup and "
        "warmup-stable-decay (linear, 1-sqrt, cosine) follow theirs, each group scaled, each re-planned on a "
        "resume of another length"
    ),
]


def _lrs(schedule: type, warmup: int, total: int, peak: float = 1e-2, scales=(1.0,), **kwargs) -> list[list[float]]:
    """The lr of each group at every optimizer step 0 .. total-1."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr_scale": s} for s in scales]
    optimizer = build_optimizer(lambda g: torch.optim.SGD(g, lr=peak), groups)
    scheduler = schedule(optimizer, total, warmup, **kwargs)
    lrs = []
    for _ in range(total):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return lrs


def test_the_default_cosine_is_bitwise_the_closed_form() -> None:
    # The same arithmetic, written out independently of project/recipe.py: equal to the last bit.
    peak, min_lr, warmup, total = 3e-3, 1e-5, 7, 40
    expected = [
        peak * (s + 1) / warmup
        if s < warmup
        else min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (s - warmup) / (total - 1 - warmup))))
        for s in range(total)
    ]
    assert [g[0] for g in _lrs(WarmupCosine, warmup, total, peak, min_lr=min_lr)] == expected


def test_landmarks_of_the_cosine() -> None:
    peak, min_lr, warmup, total = 1e-2, 1e-4, 10, 111
    lrs = [g[0] for g in _lrs(WarmupCosine, warmup, total, peak, min_lr=min_lr)]
    assert lrs[0] == pytest.approx(peak / warmup, rel=1e-12)  # starts near zero
    assert lrs[warmup - 1] == pytest.approx(peak, rel=1e-12)  # warmup ends at the peak
    assert lrs[warmup] == pytest.approx(peak, rel=1e-12)  # the cosine starts there
    assert lrs[warmup + 50] == pytest.approx((peak + min_lr) / 2, rel=1e-12)  # half way down: 50 of 100 steps
    assert lrs[-1] == pytest.approx(min_lr, rel=1e-12)  # the final step uses min_lr
    assert all(a < b for a, b in itertools.pairwise(lrs[:warmup]))
    assert all(a > b for a, b in itertools.pairwise(lrs[warmup:]))


def _warmup(s: int, peak: float, warmup: int) -> float:
    return peak * (s + 1) / warmup


@pytest.mark.parametrize("shape", ["linear", "1-sqrt", "cosine"])
def test_warmup_stable_decay_decays_over_the_last_fraction_of_the_run(shape: str) -> None:
    # 100 steps, 5 of warmup, decay_fraction 0.2: D = 20 steps below the peak (80..99), the floor at step 99.
    peak, floor, warmup, total = 1e-2, 1e-4, 5, 100
    g = {"linear": lambda q: 1 - q, "1-sqrt": lambda q: 1 - math.sqrt(q),
         "cosine": lambda q: 0.5 * (1 + math.cos(math.pi * q))}[shape]  # fmt: skip
    expected = [
        _warmup(s, peak, warmup) if s < warmup else peak if s < 79 else floor + (peak - floor) * g((s - 79) / 20)
        for s in range(total)
    ]
    lrs = [x[0] for x in _lrs(WarmupStableDecay, warmup, total, peak, min_lr=floor, shape=shape)]
    assert lrs == pytest.approx(expected, rel=1e-12)
    assert sum(lr < peak for lr in lrs[warmup:]) == 20 and lrs[-1] == pytest.approx(floor, rel=1e-12)


def test_linear_decay_and_constant_after_warmup() -> None:
    peak, floor, warmup, total = 1e-2, 1e-3, 4, 25
    linear = [_warmup(s, peak, warmup) if s < warmup else floor + (peak - floor) * (1 - (s - warmup) / 20)
              for s in range(total)]  # fmt: skip
    assert [x[0] for x in _lrs(WarmupLinear, warmup, total, peak, min_lr=floor)] == pytest.approx(linear, rel=1e-12)
    constant = [_warmup(s, peak, warmup) if s < warmup else peak for s in range(total)]
    assert [x[0] for x in _lrs(WarmupConstant, warmup, total, peak)] == pytest.approx(constant, rel=1e-12)


@pytest.mark.parametrize("schedule", [WarmupCosine, WarmupLinear, WarmupStableDecay])
def test_a_group_at_another_lr_follows_the_same_curve_scaled(schedule: type) -> None:
    # A backbone at 0.1x: its whole curve, floor included, is the reference group's times 0.1.
    for head, backbone in _lrs(schedule, 3, 30, 1e-2, scales=(1.0, 0.1), min_lr=1e-4):
        assert backbone == pytest.approx(0.1 * head, rel=1e-12)


@pytest.mark.parametrize("schedule", [WarmupCosine, WarmupLinear, WarmupConstant, WarmupStableDecay])
def test_a_resumed_schedule_continues_on_the_curve_of_its_new_length(schedule: type) -> None:
    # A run of 30 steps saved at step 12, resumed as a run of 50: steps 12..49 are those of a 50-step plan.
    kwargs = {} if schedule is WarmupConstant else {"min_lr": 1e-4}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    first = schedule(optimizer, 30, 3, **kwargs)
    for _ in range(12):
        optimizer.step()
        first.step()
    state = (optimizer.state_dict(), first.state_dict())
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
    resumed = schedule(optimizer, 50, 3, **kwargs)
    optimizer.load_state_dict(state[0])  # Lightning's order: the optimizer, then the scheduler
    resumed.load_state_dict(state[1])
    lrs = []
    for _ in range(12, 50):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        resumed.step()
    assert lrs == [g[0] for g in _lrs(schedule, 3, 50, **kwargs)][12:]


def test_no_warmup_starts_at_the_peak() -> None:
    assert _lrs(WarmupCosine, 0, 5, 1.0)[0] == [1.0]


def test_warmup_fraction_or_count() -> None:
    assert resolve_warmup_steps(0.05, 800) == 40
    assert resolve_warmup_steps(0.05, 801) == 41  # rounded up
    assert resolve_warmup_steps(12, 800) == 12
    with pytest.raises(ConfigError, match=r"model\.warmup=1\.0"):
        resolve_warmup_steps(1.0, 800)
    with pytest.raises(ConfigError, match="warmup must be shorter than the run"):
        _lrs(WarmupCosine, 5, 5)
