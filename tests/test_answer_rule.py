"""The rule under the README's measured table says what skipping QK-norm cost at each arm's
best LR, and says so as a bound where a best LR lay at the end of the LRs run."""

from __future__ import annotations

from analysis.answer_table import size_sentence


def _row(body, onset, on_text="0.003", off_text="0.003", gap=(0.027, 0.012, 0.042)):
    return {"point": f"w{body[0]}-d6-hd64-s1200-wu480", "body": body, "params": body[0] ** 2 * 72,
            "warmup": 480, "steps": 1200, "seeds": 5, "onset_lr": onset, "onset": f"{onset:g}",
            "best_lr_on_text": on_text,
            "best_lr_off_text": off_text, "best_gap": gap[0], "best_gap_lo": gap[1],
            "best_gap_hi": gap[2]}


def test_the_cost_at_each_arms_best_lr_is_a_bound_where_a_best_lr_is_at_the_grids_end():
    small = _row((192, 6, 64), 0.005)
    measured = size_sentence([small, _row((256, 6, 64), 0.00316)])
    assert "cost +0.027 [+0.012, +0.042] nats even with each arm at its best LR;" in measured \
        or measured.endswith("even with each arm at its best LR.")
    edge = size_sentence([small, _row((256, 6, 64), 0.00316, "≤ 0.001", "≤ 0.001")])
    assert "even with each arm at its best LR" not in edge
    assert ("cost +0.027 [+0.012, +0.042] nats with each arm at the smallest LR run (where both"
            " did best: their best LRs may lie lower)") in edge
