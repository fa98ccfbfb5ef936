"""Two sweeps compared at the level of their answers (analysis/compare.py, `just report A B`):
known answers on hand-made studies, then a tiny MLX sweep against the same plan trained by
PyTorch on the CPU, in two folders and in one."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from analysis import compare as K
from analysis import hypotheses as H
from analysis import metrics as M
from analysis import verdicts as V
from analysis.__main__ import main
from analysis.report import parse_args

GRID = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
SEED_OFFSET = [0.0, 0.01, -0.01]  # shared by both arms of a seed (paired)
GAP_NOISE = [0.004, -0.003, -0.001]  # each seed's own gap


def study(first_needed: float) -> SimpleNamespace:
    """One depth (2), three seeds: on at 3.0, off as good below `first_needed` and 0.5 worse
    from it, diverged at the largest LR; what compare reads of a Study."""
    rows = []
    for lr in GRID:
        for seed in range(3):
            on = 3.0 + SEED_OFFSET[seed]
            off = None if lr == GRID[-1] else on + GAP_NOISE[seed] + 0.5 * (lr >= first_needed)
            rows += [(q, lr, seed, loss) for q, loss in (("rmsnorm", on), ("none", off))]
    points = pl.DataFrame(
        [{"depth": 2, "qk_norm": q, "arm": q, "lr": lr, "seed": s, "final_val_loss": loss,
          "status": "diverged" if loss is None else "completed", "init_loss": 5.5}
         for q, lr, s, loss in rows],
        schema={"depth": pl.Int64, "qk_norm": pl.String, "arm": pl.String, "lr": pl.Float64,
                "seed": pl.Int64, "final_val_loss": pl.Float64, "status": pl.String,
                "init_loss": pl.Float64})
    v = V.study_verdicts(points, M.Options())
    return SimpleNamespace(points=points, gaps=v.gaps, thresholds=v.thresholds,
                           verdicts=v.verdicts)


def test_two_studies_compared_cell_by_cell_onset_by_onset_and_verdict_by_verdict():
    a, b = study(3e-2), study(1e-2)  # b needs QK-norm from one grid LR lower
    out = K.compare(a, b, "laptop", "gpu", M.Options())
    assert out.gaps.height == len(GRID)
    differ = out.gaps.filter(~pl.col("decisions_agree"))
    assert differ["lr"].to_list() == [1e-2]
    assert differ.row(0, named=True)["decision"] == H.NO_DIFFERENCE
    assert differ.row(0, named=True)["decision_b"] == H.OFF_WORSE
    # the onsets: each where the fitted gap reaches 0.1 of its 0.5, a fifth of the way (in log
    # LR) up from the grid LR below the first needed; b's lies about half a decade lower
    onset = out.onsets.row(0, named=True)
    a_lr, b_lr = 1e-2 * (3e-2 / 1e-2) ** 0.2, 3e-3 * (1e-2 / 3e-3) ** 0.2
    assert onset["onset_lr"] == pytest.approx(a_lr, rel=0.01)
    assert onset["onset_lr_b"] == pytest.approx(b_lr, rel=0.01)
    assert onset["difference"] == pytest.approx(math.log10(onset["onset_lr_b"]
                                                           / onset["onset_lr"]))
    assert onset["difference"] == pytest.approx(math.log10(b_lr / a_lr), abs=0.01)
    # the interval: from both sweeps' whole-seed draws; it holds the difference and excludes 0
    assert onset["difference_lo"] <= onset["difference"] <= onset["difference_hi"] < 0
    assert 0 <= onset["draws_at_a_bound"] <= 1 and onset["note"] == ""
    assert onset["tested_rule"] != onset["tested_rule_b"]
    assert out.verdicts["hypothesis"].to_list() == ["H1", "H2", "H3"]
    assert out.verdicts.filter(pl.col("hypothesis") == "H1")["agree"].to_list() == [True]
    text = out.sentences
    assert text[0] == (f"The cell decisions agree at {len(GRID) - 1} of the {len(GRID)} (depth, "
                       "LR) cells run in both; the gaps' 95% intervals overlap at "
                       f"{int(out.gaps['intervals_overlap'].sum())}.")
    assert "depth 2 LR 0.01 (no difference in laptop, off worse in gpu)" in text[1]
    assert text[2].startswith(f"Depth 2 (QK-norm): onset {onset['onset']} in laptop, "
                              f"{onset['onset_b']} in gpu; gpu minus laptop -0.5")
    assert len(out.chart.to_dict()["layer"]) == 2
    # a study with no onset on one side: said so, no difference
    none = K._difference(None, None, M.Options(), "x")
    assert none["difference"] is None and none["note"].startswith("no onset in both")


ENGINES = {"laptop": ["backend=mlx"], "gpu": ["backend=torch", "device=cpu"]}


def plan_words(data: str, runs: Path, name: str) -> list[str]:
    """One plan, tiny: depth 1, both arms, 3 LRs, 2 seeds, 30 steps of 4 x 32 tokens, nothing
    added after the grid."""
    return ["preset=demo", f"data={data}", f"runs_dir={runs}", f"name={name}", "depth=1",
            "d_model=32", "n_heads=2", "block_size=32", "batch_size=4", "max_steps=30",
            "warmup_steps=5", "eval_every=10", "eval_batches=2", "probe_every=10",
            "log_every=5", "ckpt_every=10", "divergence_window=10", "arms=none,rmsnorm",
            "lrs=3e-3,3e-2,1", "seeds=0,1", "refine=false", "max_seeds=2", *ENGINES[name]]


@pytest.fixture(scope="module")
def sweeps(tiny_data, tmp_path_factory) -> Path:
    """runs/laptop (MLX) and runs/gpu (PyTorch, CPU): the grid of one plan, 12 runs each."""
    from qkstudy.sweep.config import grid, parse_sweep_config
    from qkstudy.trainer import train

    runs = tmp_path_factory.mktemp("compare") / "runs"
    for name in ENGINES:
        for cfg in grid(parse_sweep_config(plan_words(tiny_data, runs, name))):
            train(cfg, verbose=False)
    return runs


def table(out: Path, name: str) -> pl.DataFrame:
    return pl.read_parquet(out / "tables" / f"comparison_{name}.parquet")


def test_a_torch_sweep_set_beside_an_mlx_sweep_in_two_folders_and_in_one(sweeps, tmp_path,
                                                                          capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    laptop, gpu = sweeps / "laptop", sweeps / "gpu"
    assert main(["report", str(laptop), str(gpu)]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / "reports" / "laptop-vs-gpu"
    assert "compared: laptop against gpu" in printed and "reports/laptop-vs-gpu/" in printed
    gaps, onsets, verdicts = (table(out, n) for n in ("gaps", "onsets", "verdicts"))
    # every (depth, LR) cell of the plan, both engines' gaps, decided the way each study decides
    assert gaps.height == 3 and gaps["lr"].to_list() == pytest.approx([3e-3, 3e-2, 1.0])
    assert (gaps["decisions_agree"] == (gaps["decision"] == gaps["decision_b"])).all()
    from analysis import load_study

    for side, suffix in ((laptop, ""), (gpu, "_b")):
        alone = load_study(side)
        assert alone.framework == ("mlx" if side == laptop else "torch")
        assert gaps[f"mean_gap{suffix}"].to_list() == pytest.approx(
            alone.gaps.sort("lr")["mean_gap"].to_list())
    assert onsets.height == 1 and verdicts["hypothesis"].to_list() == ["H1", "H2", "H3"]
    page = (out / "report.html").read_text()
    assert '<section id="comparison"><h2>laptop against gpu</h2>' in page
    assert (out / "charts" / "comparison.png").stat().st_size > 1000
    for sentence in K.sentences(gaps, onsets, verdicts, "laptop", "gpu"):
        assert f"  {sentence}" in printed
    # the GPU's runs copied home into the laptop's sweep folder: the folder's report is the MLX
    # runs' (as before); framework=mlx,torch sets the two engines' answers side by side
    both = tmp_path / "both"
    shutil.copytree(laptop, both)
    for run in gpu.iterdir():
        if run.is_dir():
            shutil.copytree(run, both / run.name)
    assert main(["report", str(both), "framework=mlx,torch"]) == 0
    out_one = tmp_path / "reports" / "both-mlx-vs-both-torch"
    assert "compared: both (mlx) against both (torch)" in capsys.readouterr().out
    assert table(out_one, "gaps").equals(gaps)
    assert table(out_one, "verdicts").equals(verdicts)


@pytest.mark.parametrize("words, message", [
    (["{laptop}", "{laptop}"], "compared with itself: give framework=A,B"),
    (["{laptop}", "framework=mlx,mlx"], "compared with itself: give framework=A,B"),
    (["{laptop}", "{laptop}", "{gpu}"], "give one runs folder, or two to compare, not 3"),
    (["{laptop}", "framework=a,b,c"], "framework= takes one name, or two to compare"),
    (["{laptop}", "{gone}.tar.xz"], "archive {gone}.tar.xz does not exist"),
    (["{laptop}", "framework=jax"], "framework=jax: no finished jax runs under"),
    (["{laptop}", "{gpu}", "framework=mlx"], "framework=mlx: no finished mlx runs under"),
])
def test_a_comparison_that_cannot_be_made_is_one_line_and_writes_nothing(
        words, message, sweeps, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = {"laptop": sweeps / "laptop", "gpu": sweeps / "gpu", "gone": tmp_path / "gone"}
    assert main(["report", *(w.format(**names) for w in words)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message.format(**names) in err, err
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_report_words_name_the_folder_compared_with(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mini").mkdir()
    (tmp_path / "mini-cuda").mkdir()
    runs_dir, out, options = parse_args(["mini", "mini-cuda", "alpha=0.1"])
    assert (runs_dir, out) == (Path("mini"), Path("reports") / "mini-vs-mini-cuda")
    assert (options.compare_with, options.framework, options.compare_framework) == (
        "mini-cuda", "", "")
    runs_dir, out, options = parse_args(["mini", "framework=mlx,torch"])
    assert (options.compare_with, options.framework, options.compare_framework) == (
        "mini", "mlx", "torch")
    assert out == Path("reports") / "mini-mlx-vs-mini-torch"
    assert parse_args(["mini", "framework=torch"])[1:] == (
        Path("reports") / "mini-torch", parse_args(["mini", "framework=torch"])[2])
    assert parse_args(["mini"])[2].compare_with == ""
