"""Warmup+cosine: the scheduler follows the closed form, point by point."""

import itertools
import math

import pytest
import torch

from project.engine.errors import ConfigError
from project.engine.schedule import WarmupCosine, resolve_warmup_steps


def _lrs(warmup: int, total: int, peak: float = 1e-2, min_lr: float = 1e-4) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = WarmupCosine(optimizer, warmup, total, min_lr)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_landmarks_of_the_curve() -> None:
    peak, min_lr, warmup, total = 1e-2, 1e-4, 10, 111
    lrs = _lrs(warmup, total, peak, min_lr)
    assert lrs[0] == pytest.approx(peak / warmup, rel=1e-12)  # starts near zero
    assert lrs[warmup - 1] == pytest.approx(peak, rel=1e-12)  # warmup ends at the peak
    assert lrs[warmup] == pytest.approx(peak, rel=1e-12)  # the cosine starts there
    assert lrs[warmup + 50] == pytest.approx((peak + min_lr) / 2, rel=1e-12)  # half way down: 50 of 100 steps
    assert lrs[-1] == pytest.approx(min_lr, rel=1e-12)  # the final step uses min_lr
    assert all(a < b for a, b in itertools.pairwise(lrs[:warmup]))
    assert all(a > b for a, b in itertools.pairwise(lrs[warmup:]))


def test_every_step_matches_an_independent_closed_form() -> None:
    peak, min_lr, warmup, total = 3e-3, 1e-5, 7, 40
    expected = [
        peak * (s + 1) / warmup
        if s < warmup
        else min_lr + (peak - min_lr) * (1 + math.cos(math.pi * (s - warmup) / (total - 1 - warmup))) / 2
        for s in range(total)
    ]
    assert _lrs(warmup, total, peak, min_lr) == pytest.approx(expected, rel=1e-9)


def test_no_warmup_starts_at_the_peak() -> None:
    assert _lrs(0, 5, 1.0, 0.0)[0] == 1.0


def test_warmup_fraction_or_count() -> None:
    assert resolve_warmup_steps(0.05, 800) == 40
    assert resolve_warmup_steps(0.05, 801) == 41  # rounded up
    assert resolve_warmup_steps(12, 800) == 12
    with pytest.raises(ConfigError, match=r"model\.warmup=1\.0"):
        resolve_warmup_steps(1.0, 800)
    with pytest.raises(ConfigError, match="warmup must be shorter than the run"):
        _lrs(5, 5)
