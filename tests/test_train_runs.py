"""Training runs: the files a finished run writes, the same curve bit for bit, a finished run
not trained again, the rival arms' logged losses, the run folder's name, and the train
command's input."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from qkstudy import run_folder
from qkstudy.__main__ import main
from qkstudy.config import parse_train_config
from qkstudy.errors import UsageError
from qkstudy.run_folder import RunFolder
from qkstudy.summaries import SUMMARY_FIELDS
from qkstudy.trainer import train
from tests.run_rows import rows


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


def test_run_folder_is_content_addressed(tiny_cfg):
    cfg = tiny_cfg()
    assert RunFolder.of(cfg).path == Path(cfg.runs_dir) / "test" / cfg.run_id
    assert cfg.run_id.startswith("d2-noqk-lr0.003-s0-")


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
