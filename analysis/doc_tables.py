"""`python -m analysis.doc_tables [--check]` (`just docs`): rewrite every block between
`<!-- generated: NAME -->` and `<!-- end generated -->` in README.md and docs/*.md from the
code, or (--check) exit 1 naming each block that differs."""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path
from typing import Literal, get_args, get_origin

from qkstudy import config as config_module
from qkstudy.config import TrainConfig, model_args, short_number
from qkstudy.sweep.adaptive import compared_arms, extra_seeds
from qkstudy.sweep.config import PRESETS, SweepConfig, grid, groups
from qkstudy.data.tokenizer import VOCAB_BY_TOKENIZER
from qkstudy.parameters import count_params

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


_n, _lr = "{:,}".format, "{:.3g}".format  # 12,345 tokens; an LR to 3 digits


def _list(values) -> str:
    return ", ".join(str(v) for v in values)


def _vocab(sweep: SweepConfig) -> int | None:
    return VOCAB_BY_TOKENIZER.get(Path(sweep.train.data).name.rsplit("-", 1)[-1])


def _differs(sweep: SweepConfig) -> dict[str, object]:
    base = TrainConfig()
    return {f.name: getattr(sweep.train, f.name) for f in dataclasses.fields(TrainConfig)
            if getattr(sweep.train, f.name) != getattr(base, f.name)}


def _value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, float):
        return f"{key}={short_number(value)}"
    return f"{key}={value}"


SHOWN = {"data", "d_model", "n_heads", "block_size", "bias", "batch_size", "max_steps",
         "budget_tokens", "warmup_steps", "weight_decay", "independent_wd", "eval_every",
         "eval_batches", "probe_every", "log_every", "ckpt_every", "divergence_window"}
PRESET_ROWS = ("folder", "depths", "arms", "seeds", "LR grid", "grid runs", "boundary refinement",
               "seed-mean crossing bisection", "adaptive seeds", "sweep processes", "data", "model", "run",
               "optimiser", "cadence", "other run keys")


def _column(s: SweepConfig) -> list[str]:
    """One preset's cells, in PRESET_ROWS order."""
    t, lrs, vocab, added = s.train, s.grid_lrs(), _vocab(s), extra_seeds(s)
    how = ("given as `lrs=`" if s.lrs else
           f"{_lr(s.lr_min)} to {_lr(s.lr_max)} at {_lr(s.points_per_decade)} a decade")
    refine = "off (`refine=false`)"
    if s.refine:
        refine = (f"{s.refine_steps} bisection step{'s' if s.refine_steps != 1 else ''} a curve, "
                  f"stopping within x{short_number(s.refine_factor)}: up to "
                  f"{_n(len(groups(s)) * s.refine_steps)} runs")
    crossing = "off" + (" (needs `refine=true`)" if not s.refine else "")
    if s.refine and s.threshold_steps:
        runs = len(compared_arms(s)) * len(s.depth) * s.threshold_steps * len(s.seeds) * 2
        crossing = (f"{s.threshold_steps} steps a depth, every seed, both arms: up to "
                    f"{_n(runs)} runs")
    adaptive = f"off (`max_seeds={s.max_seeds}`, not above the {len(s.seeds)} seeds)"
    if added and compared_arms(s):
        adaptive = (f"seeds {_list(added)} in cells still open, up to `max_seeds={s.max_seeds}`; "
                    f"gap that counts `min_gap={short_number(s.min_gap)}` nats")
    steps = f"{_n(t.steps)} steps" + (f" (`budget_tokens={_n(t.budget_tokens)}`)"
                                      if t.budget_tokens else "")
    decay = (f"independent weight decay {short_number(t.weight_decay)} (`independent_wd=true`)"
             if t.independent_wd else
             f"coupled weight decay {short_number(t.weight_decay)} (scaled by the LR)")
    return [
        f"`{s.runs_dir}/{s.name}`", _list(s.depth), _list(s.arms), _list(s.seeds),
        f"{len(lrs)} LRs, {how}: {_list(_lr(x) for x in lrs)}",
        f"{_n(len(grid(s)))} = {len(lrs)} LRs x {len(s.arms)} arms x {len(s.seeds)} seeds x "
        f"{len(s.depth)} dep{'ths' if len(s.depth) != 1 else 'th'}",
        refine, crossing, adaptive, f"`jobs={s.jobs}`", f"`{t.data}`",
        f"d_model {t.d_model}, {t.n_heads} heads (head_dim {t.head_dim}), block {t.block_size}, "
        f"bias {str(t.bias).lower()}, vocabulary " + (_n(vocab) if vocab else "from the data"),
        f"{steps} of batch {t.batch_size} x block {t.block_size} = {_n(t.tokens_per_step)} "
        f"tokens: {_n(t.steps * t.tokens_per_step)} tokens a run",
        f"AdamW, warmup {_n(t.warmup_steps)} steps, {decay}",
        f"eval every {_n(t.eval_every)} steps ({t.eval_batches} batches), probes every "
        f"{_n(t.probe_every)}, log every {t.log_every}, checkpoint every {_n(t.ckpt_every)}, "
        f"divergence window {t.divergence_window}",
        _list(f"`{_value(k, v)}`" for k, v in _differs(s).items() if k not in SHOWN) or "-",
    ]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|").replace("<", "\\<") for cell in row)
              + " |" for row in rows]
    return "\n".join(lines) + "\n"


def presets_table() -> str:
    columns = [_column(s) for s in PRESETS.values()]
    return _table([""] + [f"`{name}`" for name in PRESETS],
                  [[what, *(c[i] for c in columns)] for i, what in enumerate(PRESET_ROWS)])


def parameters_table() -> str:
    """Parameters per preset and depth, QK-norm off (on adds 2 x head_dim gains a layer)."""
    shapes: dict[tuple, list[str]] = {}  # one row per model shape: presets that share it
    for name, s in PRESETS.items():
        t = s.train
        key = (_vocab(s), t.d_model, t.n_heads, t.block_size, t.bias, s.depth)
        if key[0] is not None:
            shapes.setdefault(key, []).append(f"`{name}`")
    rows = []
    for (vocab, d_model, n_heads, block_size, bias, depths), names in shapes.items():
        for depth in depths:
            p = count_params(model_args(TrainConfig(depth=depth, d_model=d_model, n_heads=n_heads,
                                                    block_size=block_size, bias=bias), vocab))
            rows.append([", ".join(names), str(depth), _n(p["total"]), _n(p["non_embedding"]),
                         _n(p["embedding"]), _n(2 * (d_model // n_heads) * depth)])
    return _table(["preset", "depth", "total", "non-embedding", "embedding (wte + wpe)",
                   "QK-norm adds"], rows)


def _field_comments() -> dict[str, str]:
    """Each TrainConfig field's comment: the comment lines just above it and the one after it."""
    source = Path(config_module.__file__).read_text()
    body = source[source.index("class TrainConfig"):]
    out, above = {}, []
    for line in body[:body.index("\n    @property")].splitlines():
        match = re.match(r"    (\w+): ", line)
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("#").strip())
            continue
        if match:
            out[match.group(1)] = " ".join([*above, line.partition("#")[2].strip()]).strip()
        above = []
    return out


def _choices(hint) -> str:
    if get_origin(hint) is Literal:
        return " | ".join(get_args(hint))
    return {bool: "true | false", int: "integer", float: "number", str: "text"}.get(hint, "")


def _in_run_id(name: str) -> str:
    if name in TrainConfig.NOT_IN_RUN_ID:
        return "no"
    if name == "device":
        return "with backend=torch"
    if name in TrainConfig.LEGACY:
        return f"unless {_value(name, TrainConfig.LEGACY[name])}"
    return "yes"


def run_keys_table() -> str:
    hints = typing.get_type_hints(TrainConfig)
    notes = _field_comments()
    rows = []
    for f in dataclasses.fields(TrainConfig):
        default = _value(f.name, f.default).partition("=")[2]
        rows.append([f"`{f.name}`", f"`{default}`" if default else "(empty)",
                     _choices(hints[f.name]), _in_run_id(f.name), notes.get(f.name, "")])
    return _table(["key", "default", "takes", "in the run id", "the code's comment"], rows)


def probes_table() -> str:
    from qkstudy.probe_registry import PROBES

    return _table(["probe", "over layers", "worse when", "what", "worst value per run"],
                  [[f"`{p.name}`", p.over_layers, p.worse or "-", p.words,
                    "yes" if p.tracked else ""] for p in PROBES.values()])


def summary_keys_table() -> str:
    from qkstudy.summaries import SUMMARY_FIELDS

    return _table(["key", "kind", "runs", "what"],
                  [[f"`{k}`", f.kind, f.runs, f.words] for k, f in SUMMARY_FIELDS.items()])


BLOCKS = {"presets": presets_table, "preset-parameters": parameters_table,
          "probes": probes_table, "summary-keys": summary_keys_table,
          "run-keys": run_keys_table}


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group(2)]() + m.group(4), text)


def stale(root: Path = ROOT) -> list[str]:
    out = []
    for path in doc_files(root):
        for m in BLOCK.finditer(path.read_text()):
            if m.group(2) not in BLOCKS:
                out.append(f"{path.relative_to(root)}: {m.group(2)} (no such table)")
            elif m.group(3) != BLOCKS[m.group(2)]():
                out.append(f"{path.relative_to(root)}: {m.group(2)}")
    return out


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        asked = argv in (["--help"], ["-h"])
        print("usage: python -m analysis.doc_tables [--check]", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    differ = stale()
    for line in differ:
        print(f"out of date: {line} (just docs rewrites it)" if argv else f"rewrote {line}")
    if argv:
        return 1 if differ else 0
    for path in doc_files():
        if render(text := path.read_text()) != text:
            path.write_text(render(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
