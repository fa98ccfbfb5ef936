"""`python -m crosscheck spot-check RUN_DIR [device=...] [data=PATH]`: a finished run trained
again by the other engine (an MLX run by PyTorch, a PyTorch run by MLX), judged against it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from qkstudy import files, trainer
from qkstudy.config import TORCH_OPTIONS, TrainConfig, apply_overrides, load_config, \
    split_key_values
from qkstudy.data.load import data_change
from qkstudy.errors import UsageError
from qkstudy.run_folder import COMPARISON, RunFolder

OPTIONS = ("device", "data")
OTHER = {"mlx": "torch", "torch": "mlx"}
# The judgement: the largest relative deviation |twin - run| / |run| over the steps both runs
# logged (a 100-step depth-4 run on the CPU measured 7e-5 in training loss, 5.8e-3 in gradient
# norm: docs/torch_ref.md), the final validation loss, and the same outcome.
TOLERANCES = {"train_loss": 1e-3, "val_loss": 1e-3, "final_val_loss": 1e-3, "grad_norm": 1e-2}
CURVES = ("train_loss", "val_loss", "grad_norm")


def reference_config(run_dir: Path) -> TrainConfig:
    """The finished run's config, where it lives; a UsageError for a damaged or foreign folder."""
    folder = RunFolder(run_dir)
    if not run_dir.is_dir() or not folder.config_file.is_file():
        raise UsageError(f"{run_dir} is not a run folder (no {folder.config_file.name})")
    cfg = load_config(str(folder.config_file))  # a UsageError for what is not a config
    recorded = (folder.read_config() or {}).get("run_id") or run_dir.name
    if cfg.run_id != recorded or run_dir.resolve().name != recorded:
        raise UsageError(f"{folder.config_file} rebuilds run_id {cfg.run_id}, not the run's "
                         f"{recorded} in folder {run_dir.resolve().name}: the run folder is "
                         "damaged or from another version of this tool")
    done = folder.intact_summary()  # a DamagedRun (one line) for damaged files
    if done is None:
        status = folder.summary_record().get("status") or "not finished"
        raise UsageError(f"{run_dir} is {status}: spot-check a completed or diverged run")
    # config.json leaves out where the run lives; the folder says it: <runs_dir>/<sweep>/<run>
    where = run_dir.resolve()
    return dataclasses.replace(cfg, runs_dir=str(where.parent.parent), sweep=where.parent.name)


def twin_config(run_dir: str | Path, device: str = "auto", data: str | None = None
                ) -> tuple[TrainConfig, TrainConfig]:
    """(the run's config, its twin's: the same run in the other engine, beside it)."""
    cfg = reference_config(Path(run_dir))
    if cfg.backend == "torch" and cfg.precision != "fp32":
        raise UsageError(f"{run_dir} computed in {cfg.precision}; a spot check compares float32 "
                         "runs (precision=fp32)")
    if cfg.backend == "torch" and device != "auto":
        raise UsageError(f"device={device} places a torch twin; {run_dir} is a torch run, whose "
                         "twin is an MLX run (MLX picks its own device)")
    twin = apply_overrides(cfg, {"device": device, **({"data": data} if data else {})})
    if cfg.backend == "mlx":
        return cfg, dataclasses.replace(twin, backend="torch").validate()
    return cfg, dataclasses.replace(twin, backend="mlx", **TORCH_OPTIONS).validate()


def spot_check(run_dir: str | Path, device: str = "auto", data: str | None = None,
               verbose: bool = True) -> tuple[Path, dict]:
    """Train (or find) the twin, compare it with the run, write the comparison beside it."""
    cfg, twin = twin_config(run_dir, device, data)
    recorded = (RunFolder.of(cfg).read_manifest() or {}).get("data")
    now = trainer.data_check(twin)[0]  # None when the data cannot be read: training says why
    change = now and isinstance(recorded, dict) and data_change(recorded, now)
    if change:
        raise UsageError(f"{run_dir} was trained on other data than {twin.data} holds ("
                         f"{change}); point data= at the prepared corpus it was trained on")
    trainer.train(twin, verbose=verbose)
    out = RunFolder.of(twin)
    comparison = compare(RunFolder.of(cfg), out)  # refreshed each time: both runs are read now
    files.write_json(out.comparison_file, comparison)
    if verbose:
        print(format_comparison(comparison))
    return out.path, comparison


def relative(a: float | None, b: float | None) -> float | None:
    """|a - b| / |b|; 0 when both are the same non-finite value, None when one is missing."""
    if a is None or b is None:
        return None
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else math.inf
    return abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else math.inf)


def deviations(twin_rows: list[dict], rows: list[dict], key, column: str) -> list[tuple]:
    """(twin row, its relative deviation from the run's row of the same key) where both hold
    a value of `column`."""
    by_key = {key(r): r for r in rows}
    return [(r, d) for r in twin_rows if key(r) in by_key
            and (d := relative(r[column], by_key[key(r)][column])) is not None]


def largest(pairs: list[tuple]) -> dict:
    row, value = max(pairs, key=lambda pair: pair[1])
    return {"max_relative_deviation": value, "at_step": row["step"],
            "mean_relative_deviation": sum(d for _, d in pairs) / len(pairs), "n": len(pairs)}


def compare(run: RunFolder, twin: RunFolder) -> dict:
    """Each number's relative deviation |twin - run| / |run|, the outcomes, and the judgement."""
    summaries = {"run": run.summary_record(), "twin": twin.summary_record()}
    digests = [((f.read_manifest() or {}).get("data") or {}).get("tokens_sha256")
               for f in (run, twin)]
    result: dict = {"run": str(run.path), "twin": str(twin.path),
                    "frameworks": {k: s.get("framework") for k, s in summaries.items()},
                    "same_data": None if None in digests else digests[0] == digests[1],
                    "definition": "|twin - run| / |run|, the largest over the common steps"}
    rows, twin_rows = (f.read_metrics() for f in (run, twin))
    rows, twin_rows = (t.to_pylist() if t is not None else [] for t in (rows, twin_rows))
    result["steps_compared"] = len({r["step"] for r in rows} & {r["step"] for r in twin_rows})
    for column in CURVES:
        pairs = deviations(twin_rows, rows, lambda r: r["step"], column)
        if pairs:
            result[column] = largest(pairs)
    final = relative(summaries["twin"].get("final_val_loss"),
                     summaries["run"].get("final_val_loss"))
    if final is not None:
        result["final_val_loss"] = {"max_relative_deviation": final, "at_step": "final"}
    probes, twin_probes = run.read_probes(), twin.read_probes()
    if probes is not None and twin_probes is not None:
        by_name: dict[str, dict] = {}
        for r, d in deviations(twin_probes.to_pylist(), probes.to_pylist(), lambda r: (
                r["step"], r["layer"], r.get("head"), r["name"]), "value"):
            if d >= by_name.get(r["name"], {}).get("max_relative_deviation", -1.0):
                by_name[r["name"]] = {"max_relative_deviation": d, "at_step": r["step"],
                                      "layer": r["layer"]}
        result["probes"] = dict(sorted(by_name.items()))
    for key in ("status", "diverged_step", "tokens_per_second"):
        result[key] = {k: s.get(key) for k, s in summaries.items()}
    result["judgement"] = judge(result)
    return result


def judge(comparison: dict) -> dict:
    failures = []
    if not comparison.get("steps_compared"):
        failures.append("no common steps to compare")
    if comparison.get("same_data") is False:
        failures.append("the two runs were trained on different data (tokens' sha256)")
    for column, tolerance in TOLERANCES.items():
        deviation = comparison.get(column, {}).get("max_relative_deviation")
        if deviation is not None and not deviation <= tolerance:
            failures.append(f"{column} deviates {deviation:.2e} > {tolerance:g} at step "
                            f"{comparison[column]['at_step']}")
    status = comparison.get("status", {})
    if status.get("run") != status.get("twin"):
        failures.append(f"outcome differs: run {status.get('run')}, twin {status.get('twin')}")
    return {"pass": not failures, "tolerances": TOLERANCES, "failures": failures}


def format_comparison(comparison: dict) -> str:
    names = comparison["frameworks"]
    lines = [f"{names['twin']} twin against the {names['run']} run over "
             f"{comparison['steps_compared']} steps (|twin - run| / |run|; same data: "
             f"{comparison['same_data']}; outcome {comparison['status']['run']} / "
             f"{comparison['status']['twin']})"]
    for column in (*CURVES, "final_val_loss"):
        if column in comparison:
            c = comparison[column]
            lines.append(f"  {column:<14} max {c['max_relative_deviation']:.2e} at step "
                         f"{c['at_step']}" + (f", mean {c['mean_relative_deviation']:.2e} "
                                              f"({c['n']} values)" if "n" in c else ""))
    probes = comparison.get("probes", {})
    if probes:  # each probe's own largest deviation is in the comparison file
        name, c = max(probes.items(), key=lambda item: item[1]["max_relative_deviation"])
        lines.append(f"  probes         max {c['max_relative_deviation']:.2e} ({name}, step "
                     f"{c['at_step']}, layer {c['layer']}; {len(probes)} probes, not judged)")
    speeds = comparison["tokens_per_second"]
    if speeds.get("run") and speeds.get("twin"):
        lines.append(f"  tokens/s       {names['run']} {speeds['run']:,.0f}, "
                     f"{names['twin']} {speeds['twin']:,.0f}")
    judgement = comparison["judgement"]
    lines.append("spot check: " + ("PASS" if judgement["pass"] else "FAIL: "
                                   + "; ".join(judgement["failures"]))
                 + " (tolerances, largest relative deviation: "
                 + ", ".join(f"{k} {v:g}" for k, v in TOLERANCES.items()) + "; same outcome)")
    return "\n".join(lines)


USAGE = f"""usage: python -m crosscheck spot-check RUN_DIR [device=auto|cuda|mps|cpu] [data=PATH]

Trains the finished run in RUN_DIR again with the other engine (an MLX run with PyTorch on
device=, a PyTorch fp32 run with MLX), from the same initial weights and batches, into its
twin's run folder beside it; compares the two (loss curve, final loss, gradient norm, outcome)
against stated tolerances into the twin's {COMPARISON}; exits 1 when a tolerance is broken.
data= points at the prepared corpus when the run's data path does not resolve here."""


def cli(argv: list[str]) -> int:
    if not argv or "=" in argv[0]:
        raise UsageError(USAGE.splitlines()[0])
    options = split_key_values(argv[1:])
    unknown = sorted(options.keys() - set(OPTIONS))
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    out, comparison = spot_check(argv[0], options.get("device", "auto"), options.get("data"))
    print(f"comparison: {RunFolder(out).comparison_file}")
    return 0 if comparison["judgement"]["pass"] else 1
