"""The trainer: determinism, exact resume, divergence, skip, CLI errors, model and optimizer."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np
import pyarrow.parquet as pq
import pytest
from mlx.utils import tree_flatten

from mlx_gpt import engine as probes
from mlx_gpt.model import GPT, ModelArgs, init_weights
from mlx_gpt.engine import make_optimizer, update
from qkstudy import files, run_folder
from qkstudy.__main__ import main
from qkstudy.config import TrainConfig, parse_train_config
from qkstudy.errors import UsageError
from qkstudy.recorder import divergence
from qkstudy.trainer import train
from qkstudy.parameters import count_params
from qkstudy.run_folder import RunFolder
from qkstudy.summaries import SUMMARY_FIELDS

LOSS_COLUMNS = ["step", "tokens", "lr", "train_loss", "grad_norm", "val_loss"]


def rows(cfg: TrainConfig) -> dict:
    return run_folder.read_parts(RunFolder.of(cfg).path / "metrics").select(LOSS_COLUMNS).to_pydict()


def test_run_writes_contract_files(tiny_cfg):
    cfg = tiny_cfg()
    summary = train(cfg, verbose=False)
    folder = RunFolder.of(cfg).path
    assert summary["status"] == "completed"
    for name in ("config.json", "manifest.json", "summary.json", "final.safetensors"):
        assert (folder / name).exists(), name
    assert not (folder / "checkpoint.safetensors").exists()
    on_disk = json.loads((folder / "summary.json").read_text())
    # the keys a finished run writes are exactly those summaries.SUMMARY_FIELDS declares
    assert set(on_disk) == {k for k, f in SUMMARY_FIELDS.items() if f.runs != "failed"}
    assert on_disk["tokens_seen"] == cfg.steps * cfg.tokens_per_step
    assert on_disk["final_val_loss"] < on_disk["init_loss"]  # it learns
    # ~uniform over the padded vocabulary (320 logits) at init
    assert math.isclose(on_disk["init_loss"], math.log(320), rel_tol=0.01)
    table = rows(cfg)
    assert table["step"] == list(range(cfg.steps + 1))  # one row per update, then the final eval
    evals = [s for s, v in zip(table["step"], table["val_loss"]) if v is not None]
    assert evals == [0, 10, 20, 30]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["versions"]["mlx"] and manifest["data_meta_sha256"] and manifest["ended"]


def test_same_config_same_curve_bit_for_bit(tiny_cfg, tmp_path):
    a = tiny_cfg(max_steps=15)
    b = dataclasses.replace(a, runs_dir=str(tmp_path / "other"))
    train(a, verbose=False)
    train(b, verbose=False)
    assert rows(a) == rows(b)


def test_finished_run_is_not_rerun(tiny_cfg):
    cfg = tiny_cfg(max_steps=10)
    first = train(cfg, verbose=False)
    parts = sorted((RunFolder.of(cfg).path / "metrics").iterdir())
    stamps = [p.stat().st_mtime_ns for p in parts]
    again = train(cfg, verbose=False)
    assert again == first
    assert [p.stat().st_mtime_ns for p in sorted((RunFolder.of(cfg).path / "metrics").iterdir())] == stamps


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_resume_after_crash_is_exact(tiny_cfg, tmp_path, monkeypatch, failure):
    reference = tiny_cfg()
    train(reference, verbose=False)

    crashed = dataclasses.replace(reference, runs_dir=str(tmp_path / "crashed"))
    real_collect = probes.collect

    def collect_then_fail(model, x, y, step):
        if step == 20:  # probes run at steps 0, 10, 20, ...: fail mid-run, after a checkpoint
            raise failure("simulated crash")
        return real_collect(model, x, y, step)

    monkeypatch.setattr(probes, "collect", collect_then_fail)
    with pytest.raises(failure):
        train(crashed, verbose=False)
    folder = RunFolder.of(crashed).path
    assert (folder / "checkpoint.safetensors").exists()
    failed = files.read_json(folder / "summary.json") or {}
    assert failed.get("status") == ("failed" if failure is RuntimeError else None)
    assert set(failed) <= {k for k, f in SUMMARY_FIELDS.items() if f.runs != "finished"}
    monkeypatch.setattr(probes, "collect", real_collect)

    summary = train(crashed, verbose=False)
    assert summary["status"] == "completed"
    assert rows(crashed) == rows(reference)  # same rows, no duplicates, bit-identical
    ref_probes = run_folder.read_parts(RunFolder.of(reference).path / "probes").select(
        ["step", "layer", "name", "value"])
    assert run_folder.read_parts(folder / "probes").select(
        ["step", "layer", "name", "value"]).equals(ref_probes)


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


def test_qk_norm_arms_share_every_other_weight():
    kwargs = dict(vocab_size=257, depth=2, d_model=32, n_heads=2, block_size=16)
    off, on = GPT(ModelArgs(**kwargs)), GPT(ModelArgs(**kwargs, qk_norm="rmsnorm"))
    init_weights(off, 3)
    init_weights(on, 3)
    off_params, on_params = dict(tree_flatten(off.parameters())), dict(tree_flatten(on.parameters()))
    assert set(on_params) - set(off_params) == {
        f"blocks.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    for name, p in off_params.items():
        assert mx.array_equal(p, on_params[name]).item(), name
    idx = mx.array(np.random.default_rng(0).integers(0, 257, (2, 16)), dtype=mx.int32)
    assert off(idx).shape == (2, 16, 320)  # vocabulary padded to a multiple of 64


def test_param_count_formula():
    model = GPT(ModelArgs(vocab_size=50257, depth=6, d_model=192, n_heads=3, block_size=256))
    d = 192
    per_block = 12 * d * d + 2 * d  # qkv + proj + fc + proj, two LayerNorm gains (no bias)
    expected = 50304 * d + 256 * d + 6 * per_block + d
    assert count_params(model.args)["total"] == expected


def test_rmsnorm_qk_norm_normalises_each_head():
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=32, n_heads=2, block_size=8,
                          qk_norm="rmsnorm"))
    init_weights(model, 0)
    x = mx.random.normal((2, 8, 32), key=mx.random.key(1)) * 5
    attn = model.blocks[0].attn
    q, k = attn.normed(*attn.heads(x)[:2])
    rms = mx.sqrt(mx.mean(q * q, axis=-1))
    assert mx.allclose(rms, mx.ones_like(rms), atol=1e-3).item()
    assert q.shape == (2, 2, 8, 16)


def test_adamw_matches_hand_computed_step():
    cfg = TrainConfig(lr=0.1, warmup_steps=0, max_steps=1000, weight_decay=0.5, grad_clip=0.0)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4))
    init_weights(model, 0)
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    grads = {k: np.full(v.shape, 0.5, np.float32) for k, v in before.items()}
    opt = make_optimizer(cfg, model.parameters())
    from mlx.utils import tree_unflatten
    norm, used = update(opt, model, tree_unflatten([(k, mx.array(v)) for k, v in grads.items()]),
                        cfg.grad_clip)
    assert norm.item() == pytest.approx(0.5 * math.sqrt(sum(v.size for v in grads.values())))
    assert used.item() == pytest.approx(0.1)
    after = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    lr = 0.1  # step 0 of a cosine with no warmup
    for name, p in before.items():
        # first bias-corrected Adam step is g / (|g| + eps) = ~1; decay only for matrices
        expected = p * (1 - lr * 0.5 if p.ndim >= 2 else 1.0) - lr * 0.5 / (0.5 + 1e-8)
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_independent_weight_decay_is_not_scaled_by_lr():
    cfg = TrainConfig(lr=1e-3, warmup_steps=0, max_steps=1000, weight_decay=0.1,
                      independent_wd=True, grad_clip=0.0)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4))
    init_weights(model, 0)
    w = np.array(model.wte.weight)
    opt = make_optimizer(cfg, model.parameters())
    zeros = {k: mx.zeros_like(v) for k, v in tree_flatten(model.parameters())}
    from mlx.utils import tree_unflatten
    update(opt, model, tree_unflatten(list(zeros.items())), cfg.grad_clip)
    np.testing.assert_allclose(np.array(model.wte.weight), w * (1 - 0.1), rtol=1e-6)


# Every parameter with ndim >= 2 decays (as nanoGPT): both embeddings (wte is also the tied
# output head) and the linear weights; gains and biases (QK-norm gains included) do not.
DECAYED = ["wte.weight", "wpe.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
           "blocks.0.mlp.fc.weight", "blocks.0.mlp.proj.weight"]


def test_weight_decay_hits_exactly_the_embeddings_and_linear_weights():
    cfg = TrainConfig(lr=0.1, warmup_steps=0, max_steps=1000, weight_decay=0.5, grad_clip=0.0)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4, bias=True,
                          qk_norm="layernorm"))
    init_weights(model, 0)
    before = dict(tree_flatten(model.parameters()))
    opt = make_optimizer(cfg, model.parameters())
    from mlx.utils import tree_unflatten
    update(opt, model, tree_unflatten([(k, mx.zeros_like(v)) for k, v in before.items()]), 0.0)
    after = dict(tree_flatten(model.parameters()))  # zero gradients: only the decay moves
    moved = [k for k in before if not mx.array_equal(before[k], after[k]).item()]
    assert moved == DECAYED
    for name in DECAYED:
        np.testing.assert_allclose(np.array(after[name]), np.array(before[name]) * 0.95, rtol=1e-6)
    # the first AdamW group (weight_decay > 0) holds exactly these parameters' moments
    assert sorted(k.rsplit(".", 1)[0] for k, _ in tree_flatten(opt.state["states"][0])
                  if k.endswith(".m")) == sorted(DECAYED)


@pytest.mark.parametrize("grad_clip, scale", [(1.0, 1.0 / (6.0 + 1e-6)), (0.0, 1.0), (10.0, 1.0)])
def test_clipping_scales_the_gradient_and_reports_the_norm_before(grad_clip, scale):
    """The first moment after one step is (1 - beta1) x the gradient actually used."""
    cfg = TrainConfig(lr=0.1, warmup_steps=0, max_steps=10, grad_clip=grad_clip)
    model = GPT(ModelArgs(vocab_size=64, depth=1, d_model=8, n_heads=2, block_size=4))
    init_weights(model, 0)
    params = tree_flatten(model.parameters())
    total = sum(v.size for _, v in params)
    grads = {k: mx.full(v.shape, 6.0 / math.sqrt(total)) for k, v in params}  # global norm 6
    opt = make_optimizer(cfg, model.parameters())
    from mlx.utils import tree_unflatten
    norm, _ = update(opt, model, tree_unflatten(list(grads.items())), grad_clip)
    assert norm.item() == pytest.approx(6.0, rel=1e-6)
    m = np.array(opt.state["states"][0]["wte"]["weight"]["m"])
    np.testing.assert_allclose(m, 0.1 * scale * 6.0 / math.sqrt(total), rtol=1e-6)


def test_checkpoint_holds_the_library_optimizer_state_bit_for_bit(tmp_path):
    from mlx.utils import tree_unflatten

    from mlx_gpt.engine import Engine
    from qkstudy.trainer import resume_point

    cfg = TrainConfig(lr=0.01, warmup_steps=2, max_steps=10, weight_decay=0.1, depth=1,
                      d_model=8, n_heads=2, block_size=4, bias=True)
    probe = (np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64))
    engine = Engine(cfg, 64, [], probe)
    model, opt = engine.model, engine.opt
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = [(k, mx.array(rng.normal(size=v.shape).astype(np.float32)))
                 for k, v in tree_flatten(model.parameters())]
        update(opt, model, tree_unflatten(grads), cfg.grad_clip)
    folder = RunFolder(tmp_path)
    path = folder.checkpoint_file
    assert folder.save_checkpoint(engine.state_arrays(), {"init_loss": 4.0}) == 3

    fresh_engine = Engine(dataclasses.replace(cfg, seed=1), 64, [], probe)
    fresh, fresh_opt = fresh_engine.model, fresh_engine.opt
    step, arrays, extra = folder.read_checkpoint(fresh_engine.state_spec())
    assert (step, extra) == (3, {"init_loss": 4.0})
    fresh_engine.load_state(arrays)
    saved, loaded = dict(tree_flatten(opt.state)), dict(tree_flatten(fresh_opt.state))
    assert saved.keys() == loaded.keys()
    assert {"states.0.step", "states.1.step", "states.0.wte.weight.m"} <= saved.keys()
    for k, a in saved.items():
        assert a.dtype == loaded[k].dtype and np.array_equal(np.array(a), np.array(loaded[k])), k
    for (k, a), (_, b) in zip(tree_flatten(model.parameters()), tree_flatten(fresh.parameters())):
        assert np.array_equal(np.array(a), np.array(b)), k
    # the next update is the same on both
    grads = tree_unflatten([(k, mx.ones_like(v)) for k, v in tree_flatten(model.parameters())])
    assert update(opt, model, grads, 1.0)[1].item() == update(fresh_opt, fresh, grads, 1.0)[1].item()
    for (k, a), (_, b) in zip(tree_flatten(model.parameters()), tree_flatten(fresh.parameters())):
        assert np.array_equal(np.array(a), np.array(b)), k

    # optimizer groups that disagree on the step: damaged, and the run restarts from step 0
    arrays = dict(arrays)
    arrays["opt.states.1.step"] = np.array(2, np.uint64)
    files.save_tensors(path, arrays, {"step": "3"})
    with pytest.raises(files.DamagedFile, match="does not match"):
        folder.read_checkpoint(fresh_engine.state_spec())
    warnings = []
    assert resume_point(cfg, folder, fresh_engine, warnings.append) == (0, {})
    assert "restarting the run from step 0" in warnings[0] and not path.exists()


@pytest.mark.parametrize("args, message", [
    (["nonsense=1"], "unknown key 'nonsense'"),
    (["depth=two"], "depth must be an integer"),
    (["lr=0"], "lr must be > 0"),
    (["lr=-1e-3"], "lr must be > 0"),
    (["d_model=30", "n_heads=4"], "not divisible"),
    (["qk_norm=maybe"], "qk_norm must be one of"),
    (["lr"], "expected key=value"),
])
def test_cli_rejects_bad_config(args, message, capsys, tmp_path):
    code = main(["train", *args, f"runs_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_cli_rejects_missing_data_and_oversized_block(tiny_data, capsys, tmp_path):
    runs = tmp_path / "runs"
    assert main(["train", f"data={tmp_path / 'nowhere'}", f"runs_dir={runs}"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert main(["train", f"data={tiny_data}", "block_size=10000000", f"runs_dir={runs}"]) == 2
    assert "block_size=10000000 is above" in capsys.readouterr().err
    assert not runs.exists()


def test_cli_trains_and_reports(tiny_data, tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["train", f"data={tiny_data}", "depth=1", "d_model=16", "n_heads=2",
                 "block_size=16", "batch_size=2", "max_steps=5", "log_every=5", "ckpt_every=5",
                 f"runs_dir={runs}"])
    assert code == 0
    assert "status: completed" in capsys.readouterr().out
    (folder,) = (runs / "adhoc").iterdir()
    assert pq.read_table(next((folder / "metrics").glob("*.parquet"))).num_rows == 6


def test_parse_train_config_types():
    cfg = parse_train_config(["lr=1e-2", "depth=6", "bias=true", "qk_norm=layernorm",
                              "budget_tokens=1e6", "batch_size=8", "block_size=125"])
    assert (cfg.lr, cfg.depth, cfg.bias, cfg.qk_norm) == (0.01, 6, True, "layernorm")
    assert cfg.steps == 1000
    with pytest.raises(UsageError, match="integer"):
        parse_train_config(["depth=1.5"])
    assert parse_train_config(["lr=1e-2"]).run_id != parse_train_config(["lr=2e-2"]).run_id
    assert parse_train_config(["runs_dir=x"]).run_id == parse_train_config([]).run_id


def test_run_folder_is_content_addressed(tiny_cfg):
    cfg = tiny_cfg()
    assert RunFolder.of(cfg).path == Path(cfg.runs_dir) / "test" / cfg.run_id
    assert cfg.run_id.startswith("d2-noqk-lr0.003-s0-")


def test_interrupt_during_a_sync_resumes_exactly(tiny_cfg, tmp_path, monkeypatch):
    """Ctrl-C after a log interval's rows are recorded but before the loop moves on: the
    checkpoint must hold exactly the updates applied, and the rows must not repeat."""
    from qkstudy import trainer

    reference = tiny_cfg()
    train(reference, verbose=False)
    interrupted = dataclasses.replace(reference, runs_dir=str(tmp_path / "interrupted"))
    real_update = trainer.Display.update

    def update_then_interrupt(self, step, *args):
        if step == 15:  # a sync that is not a checkpoint (ckpt_every=10, log_every=5)
            raise KeyboardInterrupt
        return real_update(self, step, *args)

    monkeypatch.setattr(trainer.Display, "update", update_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, verbose=False)
    monkeypatch.setattr(trainer.Display, "update", real_update)
    assert train(interrupted, verbose=False)["status"] == "completed"
    assert rows(interrupted) == rows(reference)


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


def test_rival_arms_log_the_cross_entropy_and_the_z_loss_term_apart(tiny_cfg):
    """Every arm logs train_loss = the plain cross-entropy: at step 0 (same init, same batch)
    the off, soft-cap and z-loss arms log the same loss. z_loss is its own column, null when
    off; the z-loss term changes the updates, so later losses differ."""
    curves = {}
    for name, extra in (("off", {}), ("softcap", {"attn_softcap": 0.5}), ("zloss", {"z_loss": 0.05})):
        cfg = tiny_cfg(max_steps=20, **extra)
        assert train(cfg, verbose=False)["status"] == "completed"
        curves[name] = run_folder.read_parts(RunFolder.of(cfg).path / "metrics").to_pydict()
        if extra:
            assert cfg.run_id != tiny_cfg(max_steps=20).run_id
    off, capped, z = curves["off"], curves["softcap"], curves["zloss"]
    assert z["train_loss"][0] == pytest.approx(off["train_loss"][0], rel=1e-6)
    assert all(v is None for v in off["z_loss"]) and all(v is None for v in capped["z_loss"])
    terms = [v for v in z["z_loss"][:-1]]
    assert all(v is not None and v > 0 for v in terms)
    # the term is W * mean(lse^2): with the init's near-uniform logits lse ~ ln(padded vocab)
    assert terms[0] == pytest.approx(0.05 * math.log(320) ** 2, rel=0.05)
    assert z["train_loss"][10] != pytest.approx(off["train_loss"][10], rel=1e-5)
    # a soft-cap changes the logits even at init (tiny logits pass almost unchanged, so close)
    assert capped["train_loss"][0] == pytest.approx(off["train_loss"][0], rel=1e-3)
    # ... so the curves differ (by little at this scale: some steps may still agree exactly)
    assert capped["train_loss"][:-1] != off["train_loss"][:-1]
    written = set(RunFolder.of(tiny_cfg(max_steps=20, attn_softcap=0.5)).read_probes()
                  .column("name").to_pylist())
    assert {"max_attention_logit", "max_attention_logit_capped"} <= written


def test_resume_check_counts_probe_steps_not_probe_rows(tmp_path):
    """probes/ holds one row per (layer, name) at each probe step: a checkpoint at step 20 with
    probes every 10 matches steps {0, 10} however many rows each has."""
    from qkstudy import run_folder

    metric = {name: None for name in run_folder.METRICS_SCHEMA.names}
    run_folder.write_part(tmp_path / "metrics", [{**metric, "step": s} for s in range(20)],
                      run_folder.METRICS_SCHEMA)
    probes = [{"step": s, "layer": layer, "name": "max_attention_logit", "value": 1.0}
              for s in (0, 10) for layer in range(3)]
    run_folder.write_part(tmp_path / "probes", probes, run_folder.PROBES_SCHEMA)
    assert RunFolder(tmp_path).resume_problem(20, probe_every=10) is None
    assert "lacks step 20" in RunFolder(tmp_path).resume_problem(30, probe_every=10)


def test_interrupt_and_resume_each_say_where_in_one_line(tiny_cfg, monkeypatch, capsys):
    from qkstudy import trainer

    cfg = tiny_cfg(max_steps=30)
    real_update = trainer.Display.update

    def update_then_interrupt(self, step, *args):
        real_update(self, step, *args)
        if step == 20:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Display, "update", update_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, verbose=True)
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "interrupted" in line]
    assert said == [f"{cfg.run_id} interrupted; checkpointed at step 20 of 30: the same command "
                    "resumes it"]
    monkeypatch.setattr(trainer.Display, "update", real_update)
    assert train(cfg, verbose=True)["status"] == "completed"
    assert f"{cfg.run_id} resuming from step 20 of 30; compiling" in capsys.readouterr().out


def test_a_resumed_runs_progress_line_counts_its_rate_from_its_own_first_steps(capsys):
    """A run resumed at step 8,130 whose clock held 300 s from before its checkpoint, and whose
    first interval spent 30 s compiling: its line says 25,600 tok/s once it trains at that
    rate, not the 2,795 of 1,010 steps over 370 s (an ETA of over an hour for ten minutes)."""
    from qkstudy.progress import Display

    display = Display("r", 24414, 1024)
    display.update(8140, 0.5, 330.0, None)
    display.last_print = 0.0
    display.update(9140, 0.5, 330.0 + 1000 * 1024 / 25600, None)
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("step 8140/24414 loss 0.5000 ? tok/s ETA ?")
    assert second.endswith("step 9140/24414 loss 0.5000 25,600 tok/s ETA 10m11s")


def test_interrupt_in_the_interval_that_diverges_ends_as_an_uninterrupted_run(
        tiny_cfg, tmp_path, monkeypatch):
    """SIGINT between two steps of the log interval in which the run diverges (the storm's
    d2-noqk-lr0.316-s0): the run, resumed, ends with the rows, probes, summary and weights of
    an uninterrupted one."""
    from reliability.compare import compare_run

    from qkstudy import interrupts

    reference = tiny_cfg(lr=30.0, max_steps=200, warmup_steps=2, grad_clip=0.0,
                         weight_decay=0.0, log_every=20, ckpt_every=20)
    diverged = train(reference, verbose=False)["diverged_step"]
    assert diverged is not None and (diverged + 1) % 20, "no step between it and its sync"
    interrupted = dataclasses.replace(reference, runs_dir=str(tmp_path / "interrupted"))
    steps = iter(range(10**6))
    real_check = interrupts.Deferred.check

    def signal_after_the_divergence(self):
        if next(steps) == diverged + 1:
            self.signum = interrupts.signal.SIGINT
        real_check(self)

    monkeypatch.setattr(interrupts.Deferred, "check", signal_after_the_divergence)
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, verbose=False)
    monkeypatch.setattr(interrupts.Deferred, "check", real_check)
    assert train(interrupted, verbose=False)["status"] == "diverged"
    assert compare_run(RunFolder.of(reference).path, RunFolder.of(interrupted).path) == []
