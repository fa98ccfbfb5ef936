"""Divergence: the rule, a transient spike counted but not fatal, the recorder stopping at the
first diverged step, and a run at a high LR that diverges and stops."""

from __future__ import annotations

import pytest

from qkstudy.config import TrainConfig
from qkstudy.recorder import divergence
from qkstudy.run_folder import RunFolder
from qkstudy.trainer import train
from tests.run_rows import rows


def test_high_lr_diverges_and_stops(tiny_cfg):
    cfg = tiny_cfg(lr=30.0, max_steps=200, warmup_steps=2, grad_clip=0.0, weight_decay=0.0)
    summary = train(cfg, verbose=False)
    assert summary["status"] == "diverged"
    assert summary["diverged_step"] is not None and summary["diverged_step"] < 60
    assert summary["diverged_reason"]
    table = rows(cfg)
    assert max(table["step"]) == summary["diverged_step"]  # stops at the first bad step's sync
    assert summary["final_val_loss"] is None


def test_divergence_rule():
    cfg = TrainConfig(warmup_steps=10, divergence_margin=1.0, divergence_window=4)
    high = [9.0] * 4
    assert divergence(cfg, 5, float("nan"), 1.0, 3.0, []) == "non-finite loss"
    assert divergence(cfg, 5, 2.0, float("inf"), 3.0, []) == "non-finite gradient norm"
    assert divergence(cfg, 5, 9.0, 1.0, 3.0, high) is None  # still in warmup
    assert divergence(cfg, 10, 9.0, 1.0, 3.0, high[:3]) is None  # window not yet full
    assert divergence(cfg, 10, 4.5, 1.0, 3.0, [2.0, 4.5, 4.5, 4.5]).startswith(
        "median loss 4.500 of the last 4 steps above")
    # one spike (or two of four) is not a divergence; the median must stay above
    assert divergence(cfg, 10, 11.0, 1.0, 3.0, [3.0, 3.1, 3.0, 11.0]) is None
    assert divergence(cfg, 10, 11.0, 1.0, 3.0, [3.0, 3.1, 11.0, 11.0]) is None


def test_a_transient_spike_is_counted_not_fatal(tmp_path):
    from qkstudy.recorder import Recorder

    # the case that flipped a verdict: one batch at 11.35 nats, then recovery
    cfg = TrainConfig(warmup_steps=0, divergence_window=50, log_every=10)
    rec = Recorder(cfg, RunFolder(tmp_path))
    rec.record_val(0, 5.78)
    losses = [5.7 - 0.02 * i for i in range(20)] + [11.35] + [5.2 - 0.01 * i for i in range(79)]
    assert rec.record_steps((i, v, 1.0, 0.1) for i, v in enumerate(losses)) is False
    assert rec.status == "completed"
    h = rec.health
    assert h.loss_spikes == 1 and h.max_spike_step == 20
    assert h.max_spike == pytest.approx(11.35 - min(losses[:20]))
    # a sustained excursion past init + margin diverges once the window's median is above
    rec = Recorder(cfg, RunFolder(tmp_path))
    rec.record_val(0, 5.78)
    assert rec.record_steps((i, 3.0 if i < 30 else 7.5, 1.0, 0.1) for i in range(100)) is True
    assert rec.diverged_step == 55  # 26 of the last 50 losses above 6.78: the median crosses
    # the state round-trips, so a resumed run keeps judging the same window
    again = Recorder(cfg, RunFolder(tmp_path), **rec.state())
    assert again.health == rec.health


def test_recorder_stops_at_the_first_diverged_step(tmp_path):
    from qkstudy.recorder import Recorder

    cfg = TrainConfig(warmup_steps=0, divergence_margin=1.0, divergence_window=1, log_every=5,
                      eval_every=5)
    rec = Recorder(cfg, RunFolder(tmp_path))
    rec.record_val(0, 5.0)
    steps = [(0, 4.0, 1.0, 0.1), (1, 4.5, 1.0, 0.1), (2, 6.5, 1.0, 0.1), (3, 3.0, 1.0, 0.1)]
    assert rec.record_steps(steps[:2]) is False
    assert rec.record_steps(steps) is True  # steps 0 and 1 are not recorded twice
    assert [r["step"] for r in rec.metric_rows] == [0, 1, 2]
    assert rec.metric_rows[0]["val_loss"] == 5.0 and rec.metric_rows[1]["val_loss"] is None
    assert (rec.status, rec.diverged_step) == ("diverged", 2)
    assert rec.record_steps([(4, 3.0, 1.0, 0.1)]) is True and len(rec.metric_rows) == 3
