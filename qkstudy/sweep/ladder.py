"""`python -m qkstudy ladder`: the pre-registered ladder of width and training length
(docs/report.md#the-ladder-how-the-answer-moves-with-scale-fixed-2026-12-01-before-any-ladder-run),
each point a plain sweep written as the sweep's own words, run in order into <runs_dir>/<point>."""

from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path

from ..config import split_flags, split_key_values, take
from ..data.prepare import cli as prepare_cli
from ..errors import UsageError
from . import command as sweep_cli

USAGE = """usage: python -m qkstudy ladder [points=NAME,NAME] [key=value ...] [--dry-run]

Runs the ladder's points in order (docs/report.md, the ladder's plan), each a sweep into
runs/ladder/<point>: depth 4, head_dim 32, both arms, seeds 0-4, LRs 1e-4 to 3 in half-decades,
backend=torch. A finished point is skipped, an unfinished one resumes.
  points=   which points, in the given order (default: every ladder point, cheapest first);
            known: {points}
  runs_dir= the ladder's folder (default runs/ladder)
  --dry-run print each point's plan (runs, memory, hours on this machine) and its sweep command
  any other key=value goes into every point's sweep (e.g. jobs=1, device=cuda)"""

# Half-decades from below any threshold measured so far to past divergence
LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
SEEDS = (0, 1, 2, 3, 4)
MARGIN_PER_BYTE = 0.1  # nats: on the byte corpora, 0.1 nats per token
REFINE_STEPS = 1  # boundary-bisection steps per curve (the ladder's plan: H2 is secondary here)
# The warmup ladder's grid: without 1e-4 and 3e-4 (every onset measured lay in 0.003-0.1)
WARMUP_LRS = LRS[2:]
PROBE_SEEDS = (0, 1)
SCORED_LRS = (0.01, 0.03, 0.1, 0.3)  # around both law forms' intervals at the scored points
PROBE_LRS = (0.01, 0.03, 0.1)  # around the onsets at 4,800 steps (0.0079 and 0.046)


@dataclass(frozen=True)
class Point:
    """One point of the ladder: a model width and a training length (depth 4, head_dim 32)."""

    name: str
    d_model: int
    steps: int
    warmup: int
    depth: int = 4
    head_dim: int = 32
    block_size: int = 64
    data: str = "data/synthetic-bytes"
    lrs: tuple[float, ...] = LRS
    seeds: tuple[int, ...] = SEEDS  # fixed in advance; more up to five in cells still open
    bytes_per_token: float = 1.0  # of the point's corpus: the margin is per byte of text
    # > 0: a probe point (the warmup figure's): the off arm only, no bisection
    probe_every: int = 0
    refine_steps: int = REFINE_STEPS
    threshold_steps: int = 2
    max_seeds: int = 5  # above len(seeds): adaptive seeds in the cells still undecided

    @property
    def margin(self) -> float:
        """The plan's margin in nats per token: 0.1 nats per byte of text."""
        return round(MARGIN_PER_BYTE * self.bytes_per_token, 4)

    def words(self) -> list[str]:
        """The point as `python -m qkstudy sweep` words (the analysis plan's design)."""
        every = self.steps // 6  # evaluation, probes and divergence at the same fractions
        design = (["arms=none", "refine=false", "threshold_steps=0"] if self.probe_every else
                  ["refine=true", f"refine_steps={self.refine_steps}",
                   f"threshold_steps={self.threshold_steps}"])
        return [
            "preset=mini", f"name={self.name}", f"depth={self.depth}",
            f"lrs={','.join(f'{lr:g}' for lr in self.lrs)}",
            f"seeds={','.join(map(str, PROBE_SEEDS if self.probe_every else self.seeds))}",
            f"max_seeds={self.max_seeds}", *design, "jobs=2",
            f"data={self.data}", f"d_model={self.d_model}",
            f"n_heads={self.d_model // self.head_dim}", f"block_size={self.block_size}",
            f"max_steps={self.steps}", f"warmup_steps={self.warmup}", f"eval_every={every}",
            f"probe_every={self.probe_every or every}", f"divergence_window={every}",
            f"ckpt_every={max(10, self.steps // 30 * 10)}", "backend=torch",
            *([f"min_gap={self.margin:g}"] if self.bytes_per_token != 1.0 else [])]


POINTS = {p.name: p for p in (
    Point("w64-s300", 64, 300, 30),
    Point("w128-s300", 128, 300, 30),
    Point("w64-s1200", 64, 1200, 120),
    Point("w256-s300", 256, 300, 30),
    Point("w64-s4800", 64, 4800, 480),
    Point("w64-s4800-wu30", 64, 4800, 30),
    # the warmup ladder (docs/report.md: fixed 2026-12-03, before any of its runs)
    Point("w64-s300-wu120", 64, 300, 120, lrs=WARMUP_LRS),
    Point("w64-s1200-wu30", 64, 1200, 30, lrs=WARMUP_LRS),
    Point("w64-s1200-wu480", 64, 1200, 480, lrs=WARMUP_LRS),
    Point("w64-s4800-wu1920", 64, 4800, 1920, lrs=WARMUP_LRS),
    # the warmup figure's runs: the off arm's probes every 48 steps through 4,800 steps
    Point("probes-s4800-wu30", 64, 4800, 30, lrs=PROBE_LRS, probe_every=48),
    Point("probes-s4800-wu480", 64, 4800, 480, lrs=PROBE_LRS, probe_every=48))}
# The law's two scored points (docs/report.md: fixed 2026-12-06, before any of their runs): the
# study preset's schedule on the ladder's model (a corpus of 30M characters, so no run reads
# more tokens than it holds), and the study preset's model body at a ladder schedule
SCORED_POINTS = (
    Point("w64-s24414-wu1000", 64, 24_414, 1000, data="data/synthetic-bytes-30m",
          lrs=SCORED_LRS, seeds=(0, 1, 2)),
    Point("w192-d6-s1200-wu480", 192, 1200, 480, depth=6, head_dim=64, lrs=SCORED_LRS,
          seeds=(0, 1, 2)))
POINTS.update((p.name, p) for p in SCORED_POINTS)
# The size ladder (docs/report.md: fixed 2026-12-07, before any of its runs): width, depth and
# head dimension apart at 480 warmup steps of 1,200.
# Seeds 0-4 fixed, no adaptive seeds, no boundary bisection, one threshold-bisection step.
SIZE = {"max_seeds": 5, "refine_steps": 0, "threshold_steps": 1}
D4_LRS, D6_LRS = (0.001, 0.003, 0.01, 0.03, 0.1), (0.001, 0.003, 0.01, 0.03)
SIZE_POINTS = (
    Point("w128-s1200-wu480", 128, 1200, 480, lrs=D4_LRS[1:], **SIZE),
    Point("w192-s1200-wu480", 192, 1200, 480, lrs=D4_LRS, **SIZE),
    Point("w192-d6-hd32-s1200-wu480", 192, 1200, 480, depth=6, lrs=D6_LRS, **SIZE),
    Point("w192-d6-hd64-s1200-wu480", 192, 1200, 480, depth=6, head_dim=64, lrs=D6_LRS, **SIZE))
# The size law's two test points, predicted before their runs: a body beyond the ladder (4.72M
# parameters outside the embeddings) and the study body at the study preset's warmup; their
# grids as registered (docs/report.md: the test grids' rule)
SIZE_TESTS = (
    Point("w256-d6-hd64-s1200-wu480", 256, 1200, 480, depth=6, head_dim=64, lrs=D6_LRS, **SIZE),
    Point("w192-d6-hd64-s4800-wu1000", 192, 4800, 1000, depth=6, head_dim=64, lrs=D6_LRS,
          **SIZE))
POINTS.update((p.name, p) for p in (*SIZE_POINTS, *SIZE_TESTS))
# The warmup law's points: every width-64 ladder point
WARMUP_POINTS = ("w64-s300", "w64-s1200", "w64-s4800", "w64-s4800-wu30", "w64-s300-wu120",
                 "w64-s1200-wu30", "w64-s1200-wu480", "w64-s4800-wu1920")
# The study preset's point, where the law's prediction is tested (a GPU's: not by default)
# (GPT-2 BPE on TinyStories: 4.10 bytes a token, measured on the first 2 MiB of its train split)
STUDY_POINT = Point("study-point", 192, 24_414, 1000, depth=6, head_dim=64, block_size=256,
                    data="data/tinystories-gpt2", bytes_per_token=4.10)
KNOWN = {**POINTS, STUDY_POINT.name: STUDY_POINT}


def point_words(point: Point, extra: list[str], runs_dir: str) -> list[str]:
    """The point's sweep words with `extra` key=value words replacing those of the same key."""
    words = split_key_values(point.words())
    words["runs_dir"] = runs_dir
    words.update(split_key_values(extra))
    if point is STUDY_POINT:
        words.setdefault("batch_size", "16")
        words.setdefault("eval_batches", "20")
    return [f"{k}={v}" for k, v in words.items()]


# The synthetic corpora the points read, as `prepare synthetic` words (made when missing)
CORPORA = {"data/synthetic-bytes": [], "data/synthetic-bytes-30m": ["size_mb=30"]}


def ensure_corpus(point: Point) -> int:
    """Prepare the point's synthetic corpus if it is not there yet (0: ready)."""
    if point.data not in CORPORA or (Path(point.data) / "meta.json").is_file():
        return 0
    return prepare_cli(["synthetic", "tokenizer=bytes", *CORPORA[point.data], f"out={point.data}"])


def cli(argv: list[str]) -> int:
    words, flags = split_flags(argv, ("--dry-run", "--no-notify"))
    pairs = split_key_values(words)
    names = [n.strip() for n in take(pairs, "points", str, ",".join(POINTS)).split(",")
             if n.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown or not names:
        raise UsageError(f"points: {unknown[0] if unknown else '(none)'!r} is not a ladder point; "
                         f"known: {', '.join(KNOWN)}")
    for key in ("name", "preset"):
        if key in pairs:
            raise UsageError(f"{key} is set by each ladder point; give points= instead")
    runs_dir = take(pairs, "runs_dir", str, "runs/ladder")
    extra = [f"{k}={v}" for k, v in pairs.items()]
    passed = [f"{k}={v}" if v else k for k, v in flags.items()]  # to each point's sweep
    for i, name in enumerate(names, 1):
        words = point_words(KNOWN[name], extra, runs_dir)
        print(f"=== ladder point {i} of {len(names)}: {name}\n    python -m qkstudy sweep "
              + " ".join(words), flush=True)
        code = ensure_corpus(KNOWN[name]) or sweep_cli(words + passed)
        if code:
            return code
    return 0


USAGE = USAGE.format(points=", ".join(KNOWN))
