"""`python -m analysis report [RUNS_DIR] [key=value ...]`: the study report (docs/report.md):
tables (Parquet + CSV), charts (PNG, SVG, HTML) and one offline report.html, written into a
temporary sibling and swapped in, so a failed build leaves the earlier report as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import altair as alt
import polars as pl

from qkstudy import archive, files
from qkstudy.config import apply_overrides, split_key_values
from qkstudy.errors import UsageError
from qkstudy.files import remove_stale, swap_in
from qkstudy.run_folder import FINISHED

from . import charts as C
from . import compare as K
from . import plots as P
from . import metrics as M
from .page import failed_page, link, render_html
from .load import Runs, load_runs
from .prose import CHARTS
from .study import ReportOptions, Study, analyse, choose_framework


def build_charts(study: Study, options: ReportOptions) -> dict[str, alt.TopLevelMixin]:
    points = study.points
    probes = study.probe_steps.join(points.select("run"), on="run")
    found = sorted(probes["name"].unique().to_list())
    wanted = [n for n in options.probe_names if n in found] or P.other_probe_names(found)
    picks = P.curve_runs(points, study.arms, list(options.curve_lrs) or None, study.others)
    out = {
        "headline": C.headline_chart(study.gaps, study.thresholds, study.arms),
        "loss_vs_lr": C.loss_vs_lr_chart(points, study.others),
        "training_curves": P.training_curves_chart(pl.concat([points, study.others]),
                                                   study.runs.metrics, picks),
        "max_attention_logit": P.probe_chart(points, probes, ["max_attention_logit"],
                                             "Max attention logit vs step (seed mean; log scale)",
                                             log=True),
        "attention_entropy": P.probe_chart(points, probes, list(C.ATTENTION_PROBES[1:]),
                                           "Attention entropy vs step (seed mean)", dash="probe"),
        "lr_sensitivity": P.sensitivity_chart(points),
        "lr_landmarks": P.landmarks_chart(study.arms, study.thresholds),
    }
    if wanted:
        out["other_probes"] = P.probe_chart(
            points, probes, wanted, "Other probes vs step (reduced over layers, seed mean)",
            row="probe", dash="arm", height=C.PANEL_H - 40)
    return {k: out[k] for k in CHARTS if k in out}


def check_writable(out: Path) -> None:
    """UsageError unless the report folder can be made and written to; leaves nothing behind."""
    made = [p for p in [out, *out.parents] if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise UsageError(f"cannot write the report to {out}: {e.strerror or e}") from None
    finally:
        for folder in made:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


@contextlib.contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` that replaces it on success and is removed on error."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)  # what a killed report build left
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        swap_in(tmp, out)  # the earlier report stays if this fails
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# tables/<name>.parquet and .csv: the Study field each is written from
TABLES = {"runs": "per_run", "arms": "arms", "lr_sensitivity_per_seed": "sensitivity_per_seed",
          "max_usable_lr_per_seed": "usable_per_seed", "gaps": "gaps", "onset": "thresholds",
          "spikes": "spikes", "verdicts": "verdicts", "h1_best_loss": "best_gaps",
          "h2_tests": "h2_tests", "h3_tests": "h3_tests", "twins": "twins",
          "exploratory_gaps": "exploratory_gaps"}


def write_table(df: pl.DataFrame, folder: Path, name: str) -> None:
    # encoded in memory: a full disk is then an OSError naming the file, not a ComputeError
    parquet = io.BytesIO()
    df.write_parquet(parquet)
    (folder / f"{name}.parquet").write_bytes(parquet.getvalue())
    (folder / f"{name}.csv").write_text(df.write_csv())


def build_report(runs_dir: str | Path, out: str | Path,
                 options: ReportOptions | None = None, shown_as: tuple[str, str] | None = None
                 ) -> tuple[Path, Study | None, K.Comparison | None]:
    """Load, analyse, draw and write everything: (report.html, the study or None, the
    comparison with options.compare_with or None)."""
    options = options or ReportOptions()
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / "report.html").exists())):
        raise UsageError(f"{out} exists and is not a report folder; choose another out=DIR")
    runs = load_runs(runs_dir)
    other = load_runs(options.compare_with) if options.compare_with else None
    if shown_as:
        runs.table = runs.table.with_columns(
            pl.col("run_dir").str.replace(shown_as[0], shown_as[1], literal=True))
    study = comparison = None
    if not runs.table.filter(pl.col("status").is_in(FINISHED)).is_empty():
        choose_framework(runs, options.framework)  # a bad framework= before any work
        if other is not None:
            choose_framework(other, options.compare_framework or options.framework)
        print(f"building the report of {runs.table.height} runs in {out} (tables, charts, "
              "page) ...", file=sys.stderr, flush=True)
        study = analyse(runs, options)
        if other is not None:
            comparison = compared(study, other, runs_dir, options)
    with replacing(out) as tmp:
        tables = tmp / "tables"
        tables.mkdir()
        (tmp / "warnings.txt").write_text("".join(w + "\n" for w in runs.warnings))
        if study is None:  # no finished run: the page lists the failed ones
            write_table(runs.table, tables, "runs")
            (tmp / "report.html").write_text(failed_page(runs))
            return out / "report.html", None, None
        for name, table in TABLES.items():
            frame = getattr(study, table)
            if name != "exploratory_gaps" or frame.height:
                write_table(frame, tables, name)
        specs = {name: link(name, chart.to_dict())
                 for name, chart in build_charts(study, options).items()}
        if comparison is not None:
            for name in ("gaps", "onsets", "verdicts"):
                write_table(getattr(comparison, name), tables, f"comparison_{name}")
            specs["comparison"] = comparison.chart.to_dict()
        for name, spec in specs.items():
            C.save_chart(spec, tmp / "charts", name, scale=options.png_scale)
        (tmp / "report.html").write_text(render_html(study, specs, options, comparison))
    return out / "report.html", study, comparison


def side_name(folder: str | Path, framework: str) -> str:
    return Path(folder).name + (f" ({framework})" if framework else "")


def compared(study: Study, runs: Runs, runs_dir: str | Path, options: ReportOptions
             ) -> K.Comparison:
    """The study of `runs` (options.compare_with's, its own framework's) beside `study`."""
    framework = options.compare_framework or options.framework
    other = analyse(runs, dataclasses.replace(options, framework=framework))
    a = side_name(runs_dir, study.framework if options.framework else "")
    b = side_name(options.compare_with, other.framework if framework else "")
    if a == b:
        a, b = f"{a} ({study.framework})", f"{b} ({other.framework})"
    return K.compare(study, other, a, b, options.study)


USAGE = """usage: python -m analysis report [RUNS_DIR [OTHER_RUNS_DIR]] [key=value ...]

Tables, charts, verdicts and one offline report.html (docs/report.md). RUNS_DIR (default runs)
is a runs tree, one sweep folder, one run folder or a study archive (FILE.tar.xz, written by
python -m qkstudy archive). With OTHER_RUNS_DIR (the same plan run elsewhere: runs/mini
runs/mini-cuda), or with framework=A,B over one folder that holds both engines' runs, the page
also sets the two studies' answers side by side: per (depth, LR) both gaps and decisions, per
depth both onsets and tested rules and the onset's difference with its interval, every verdict.

keys (defaults shown):
  out=reports/<name of RUNS_DIR>  the report folder (runs/demo gives reports/demo; compared:
                                  reports/<A>-vs-<B>); an earlier report there is replaced in one
                                  step, other content refused
  framework=                      whose runs enter the study: mlx, torch, torch-bf16, ...
                                  (default: MLX's when there are any, else the most common);
                                  framework=A,B: A for RUNS_DIR, B for the study compared
  threshold=                      val loss level for steps-to-threshold (default: per depth, the
                                  largest mid-training val loss of the arms' best runs)
  curve_lrs=                      LR,LR,... for the training-curve chart (default: per depth,
                                  the off arm's optimal, max usable and first divergent LR)
  probes=                         NAME,NAME,... for the other-probes chart (default: residual
                                  kurtosis and a few others when present)
  alpha=0.05                      error level of each hypothesis's family of tests
                                  (H1 Benjamini-Hochberg, H2 and H3 Holm)
  min_gap=0.1                     nats: the plan's margin (docs/report.md): off worse by more is
                                  "needed", within +-min_gap "no difference" (10.5% perplexity)"""


@dataclass(frozen=True)
class ReportArgs:
    """The report command's key=value words, as given (checked by `parse_args`)."""

    out: str = ""  # empty: reports/<name of RUNS_DIR>
    framework: str = ""  # NAME, or NAME,NAME with a comparison
    threshold: float | None = None
    curve_lrs: str = ""
    probes: str = ""
    alpha: float = 0.05
    min_gap: float = 0.1


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _lrs(text: str) -> tuple[float, ...]:
    try:
        lrs = tuple(float(x) for x in _names(text))
    except ValueError:
        raise UsageError(f"curve_lrs takes comma-separated numbers, not {text!r}") from None
    if not all(math.isfinite(lr) and lr > 0 for lr in lrs):
        raise UsageError(f"curve_lrs: learning rates must be finite and > 0, not {text!r}")
    return lrs


def _folders(words: list[str]) -> list[str]:
    """The runs folders that lead the words (at most two), taken off `words`."""
    folders = []
    while words and ("=" not in words[0] or Path(words[0]).exists()) \
            and not words[0].startswith("-"):
        folders.append(words.pop(0))
    if len(folders) > 2:
        raise UsageError(f"give one runs folder, or two to compare, not {len(folders)}: "
                         + " ".join(folders))
    for word in words:
        if word.startswith("-"):
            raise UsageError(f"unknown flag {word}: options are key=value words, e.g. out=DIR "
                             "(python -m analysis report help)")
        if "=" not in word:
            raise UsageError(f"RUNS_DIR (and OTHER_RUNS_DIR) come first; got {word!r} after the "
                             "other words (options are key=value)")
    return folders


def _compared(runs_dir: Path, folders: list[str], framework: str) -> tuple[str, str, str]:
    """(framework, the folder compared with or "", its framework) from the words."""
    names = _names(framework)
    if len(names) > 2:
        raise UsageError(f"framework= takes one name, or two to compare, not {framework!r}")
    other = folders[1] if len(folders) > 1 else str(runs_dir) if len(names) == 2 else ""
    if other and Path(other).resolve() == runs_dir.resolve() and len(set(names)) < 2:
        raise UsageError(f"{runs_dir} compared with itself: give framework=A,B, the two "
                         "engines whose runs it holds (e.g. framework=mlx,torch)")
    return (names[0] if names else "", other, names[1] if len(names) > 1 else "")


def _label(folder: str | Path, framework: str) -> str:
    name = Path(folder).resolve().name.removesuffix(archive.SUFFIX)
    return name + (f"-{framework}" if framework else "")


def parse_args(argv: list[str]) -> tuple[Path, Path, ReportOptions]:
    """[RUNS_DIR [OTHER_RUNS_DIR]] [key=value ...] -> (runs folder, report folder, options)."""
    words = list(argv)
    folders = _folders(words)
    runs_dir = Path(folders[0]) if folders else Path("runs")
    given = split_key_values(words)
    if given.get("threshold") == "":  # threshold= as USAGE shows it: the per-depth default
        del given["threshold"]
    args = apply_overrides(ReportArgs(), given)
    if args.threshold is not None and not (math.isfinite(args.threshold) and args.threshold > 0):
        raise UsageError(f"threshold must be a finite loss > 0, not {args.threshold:g}")
    if not (math.isfinite(args.min_gap) and args.min_gap >= 0):
        raise UsageError(f"min_gap must be >= 0 nats, not {args.min_gap:g}")
    if not 0 < args.alpha < 1:
        raise UsageError(f"alpha must be between 0 and 1, not {args.alpha:g}")
    framework, other, other_framework = _compared(runs_dir, folders, args.framework)
    name = _label(runs_dir, framework)
    if other:
        name += "-vs-" + _label(other, other_framework or framework)
    out = Path(args.out) if args.out else Path("reports") / name
    options = ReportOptions(loss_threshold=args.threshold, curve_lrs=_lrs(args.curve_lrs),
                            probe_names=_names(args.probes),
                            study=M.Options(alpha=args.alpha, min_gap=args.min_gap),
                            framework=framework, compare_with=other,
                            compare_framework=other_framework)
    return runs_dir, out, options


def unpacked(path: Path, stack: contextlib.ExitStack) -> tuple[Path, tuple[str, str] | None]:
    """(a runs folder, None), or an archive unpacked for as long as `stack` lives."""
    if not path.name.endswith(archive.SUFFIX):
        return path, None
    if not path.is_file():
        raise UsageError(f"archive {path} does not exist")
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qkstudy-archive-")))
    return archive.extract(path, tmp)[0], (str(tmp) + "/", f"{path}:")


def cli(argv: list[str]) -> int:
    runs_dir, out, options = parse_args(argv)
    with contextlib.ExitStack() as stack:  # an archive stays unpacked until the report is built
        runs_dir, shown_as = unpacked(runs_dir, stack)
        if options.compare_with:
            other = unpacked(Path(options.compare_with), stack)[0]
            if not other.is_dir():
                raise UsageError(f"runs folder to compare with {other} does not exist (or is "
                                 "not a folder)")
            options = dataclasses.replace(options, compare_with=str(other))
        t0 = time.perf_counter()
        check_writable(out)
        try:
            path, study, comparison = build_report(runs_dir, out, options, shown_as)
        except OSError as e:  # the earlier report, if any, is as it was
            raise UsageError(f"cannot write the report to {out}: {e.strerror or e}; "
                             f"{files.io_advice(e)} and run the same command again") from None
    if study is None:
        print(f"report: {path} (no finished runs: every run failed; the page lists them)")
        return 0
    for warning in study.runs.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for note in study.notes:
        print(f"note: {note}", file=sys.stderr)
    several = study.verdicts["compared_arm"].n_unique() > 1
    verdicts = ", ".join(r["hypothesis"] + (f" ({r['compared_arm']})" if several else "")
                         + f" {r['verdict']}" for r in study.verdicts.iter_rows(named=True))
    print(f"report: {path} ({study.runs.table.height} runs, {study.points.height} in the study; "
          f"{verdicts or 'no verdicts'}; {time.perf_counter() - t0:.0f} s)")
    if comparison is not None:
        print(f"compared: {comparison.a} against {comparison.b}")
        for sentence in comparison.sentences:
            print(f"  {sentence}")
    return 0
