"""The probes in training: the probe batch and step 0 shared across arms, probes that leave
training alone, and the run folder's probe parts as documented and as the analysis reads them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qkstudy.batches import probe_batch
from qkstudy.run_folder import RunFolder, read_parts
from qkstudy.trainer import load_data, train
from tests.test_probes import documented_names, row_name_pattern


def probe_rows(cfg) -> list[dict]:
    return read_parts(RunFolder.of(cfg).path / "probes").to_pylist()


def step0_measure_rows(cfg) -> dict:
    return {(r["layer"], r["name"]): r["value"] for r in probe_rows(cfg)
            if r["step"] == 0 and not r["name"].startswith("update_rms_ratio/")}


def test_probe_batch_and_step0_probes_are_shared_across_arms(tiny_cfg):
    short = dict(max_steps=6, probe_every=5, eval_every=5, ckpt_every=5, warmup_steps=2)
    base, other_lr = tiny_cfg(**short), tiny_cfg(**short, lr=1e-3)
    other_arm = tiny_cfg(**short, lr=1e-3, qk_norm="rmsnorm")
    other_data = tiny_cfg(**short, data_seed=1)
    val = load_data(base)[1]
    batches = [probe_batch(val, c.data_seed, c.batch_size, c.block_size)
               for c in (base, other_lr, other_arm, other_data)]
    for same in batches[1:3]:
        assert all(np.array_equal(a, b) for a, b in zip(batches[0], same))
    assert not np.array_equal(batches[0][0], batches[3][0])

    for cfg in (base, other_lr, other_data):
        train(cfg, verbose=False)
    rows = step0_measure_rows(base)
    assert rows == step0_measure_rows(other_lr)  # same init, same probe batch: bit for bit
    differing = step0_measure_rows(other_data)
    assert rows[(-1, "loss")] != differing[(-1, "loss")]  # another data_seed, another batch


def test_probes_do_not_change_training(tiny_cfg):
    often = tiny_cfg(max_steps=10, probe_every=1, eval_every=5, ckpt_every=5)
    rarely = tiny_cfg(max_steps=10, probe_every=1000, eval_every=5, ckpt_every=5)
    losses = []
    for cfg in (often, rarely):
        train(cfg, verbose=False)
        losses.append(read_parts(RunFolder.of(cfg).path / "metrics").column("train_loss").to_pylist())
    assert losses[0] == losses[1]
    assert len({r["step"] for r in probe_rows(often)}) == 11  # steps 0..10


def test_train_writes_documented_probe_parts(tiny_cfg):
    cfg = tiny_cfg(qk_norm="rmsnorm")  # 30 steps, probes every 10
    train(cfg, verbose=False)
    run_dir = RunFolder.of(cfg).path
    rows = probe_rows(cfg)
    # one part per checkpoint interval, each named by the first and last step it holds
    import pyarrow.parquet as pq

    spans = [(min(h), max(h)) for h in (pq.read_table(part).column("step").to_pylist()
                                        for part in sorted((run_dir / "probes").glob("part-*")))]
    assert spans == [(0, 0), (10, 10), (20, 30)]
    assert sorted(p.name for p in (run_dir / "probes").glob("part-*")) == [
        f"part-{a:08d}-{b:08d}.parquet" for a, b in spans]
    # every documented probe but the soft-cap arm's own
    assert {row_name_pattern(r["name"]) for r in rows} == documented_names() - {
        "max_attention_logit_capped"}
    steps = {}
    for r in rows:
        steps.setdefault(r["name"].split("/")[0], set()).add(r["step"])
    assert steps["max_attention_logit"] == {0, 10, 20, 30}  # measure: probe steps and the end
    assert steps["update_rms_ratio"] == {0, 10, 20}  # right after updates 0, 10, 20
    # a probe call for depth 2 writes a modest number of rows
    assert sum(r["step"] == 10 for r in rows) < 150
    for r in rows:
        assert math.isfinite(r["value"]), r

    # read back by the analysis, the one reader of probe rows
    from analysis import metrics
    from analysis.load import load_runs

    per_step = metrics.probe_over_layers(load_runs(run_dir).probes).collect()
    summary = metrics.probe_summary(per_step).row(0, named=True)
    logits = [r["value"] for r in rows if r["name"] == "max_attention_logit"]
    assert summary["peak_max_attention_logit"] == pytest.approx(max(logits))
    entropies = [(r["value"], r["step"]) for r in rows if r["name"] == "attention_entropy_min_head"]
    assert (summary["worst_attention_entropy_min_head"],
            summary["worst_attention_entropy_min_head_step"]) == min(entropies)
    assert summary["final_attention_entropy_min_head"] == min(
        v for v, step in entropies if step == 30)
