"""`python -m crosscheck spot-check RUN_DIR [device=...] [data=PATH]`: an MLX run in torch."""

from __future__ import annotations

import json
import math
from pathlib import Path

from qkstudy import files, trainer
from qkstudy.run_folder import COMPARISON, RunFolder
from qkstudy.config import apply_overrides, load_config, split_key_values
from qkstudy.errors import UsageError

OPTIONS = ("device", "data")


def torch_twin(run_dir: str | Path, device: str = "auto", data: str | None = None):
    """The config of `run_dir`'s torch twin (backend=torch on `device`), where it lives."""
    run_dir = Path(run_dir)
    config_path = RunFolder(run_dir).config_file
    if not config_path.is_file():
        raise UsageError(f"{run_dir} is not a run folder (no {config_path.name})")
    cfg = load_config(str(config_path))  # a UsageError for what is not a config
    reference = json.loads(config_path.read_text())
    if reference.get("framework", "mlx") != "mlx":
        raise UsageError(f"{run_dir} is a {reference['framework']} run; spot-check an MLX run")
    reference_id = reference.get("run_id") or run_dir.name
    if cfg.run_id != reference_id:
        raise UsageError(f"{config_path} rebuilds run_id {cfg.run_id}, not the run's "
                         f"{reference_id}: the file is damaged or from another version, so the "
                         "run cannot be re-run faithfully")
    # config.json leaves out where the run lives; the folder says it: <runs_dir>/<sweep>/<run>
    where = run_dir.resolve()
    changes = {"runs_dir": str(where.parent.parent), "sweep": where.parent.name,
               "backend": "torch", "device": device, **({"data": data} if data else {})}
    return apply_overrides(cfg, changes).validate()


def spot_check(run_dir: str | Path, device: str = "auto", data: str | None = None,
               verbose: bool = True) -> tuple[Path, dict]:
    cfg = torch_twin(run_dir, device, data)
    summary = trainer.train(cfg, verbose=verbose)
    out = RunFolder.of(cfg).path
    comparison = compare(Path(run_dir), out)  # refreshed: the MLX run may have moved on
    files.write_json(RunFolder.of(cfg).comparison_file, comparison)
    if verbose:
        print(format_comparison(comparison))
    return out, summary


def _relative(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    return abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else math.inf)


def _deviations(torch_rows: list[dict], mlx_rows: list[dict], key, columns) -> dict:
    """{column: [(torch row, relative deviation from the MLX row of its key)]}."""
    mlx = {key(r): r for r in mlx_rows}
    return {c: [(r, d) for r in torch_rows if key(r) in mlx
                and (d := _relative(r[c], mlx[key(r)][c])) is not None] for c in columns}


def compare(mlx_dir: Path, torch_dir: Path) -> dict:
    """Per-step relative deviation |torch - mlx| / |mlx| of each number, and the judgement."""
    mlx, torch = RunFolder(mlx_dir), RunFolder(torch_dir)
    a, b = torch.read_metrics(), mlx.read_metrics()
    digests = [(f.read_manifest() or {}).get("data_meta_sha256") for f in (mlx, torch)]
    result: dict = {"reference_run": str(mlx_dir),
                    "same_data": digests[0] is not None and digests[0] == digests[1],
                    "definition": "max over common steps of |torch - mlx| / |mlx|",
                    "steps_compared": 0}
    if a is None or b is None:
        return {**result, "judgement": judge(result)}
    result["steps_compared"] = len({r["step"] for r in a.to_pylist()}
                                   & {r["step"] for r in b.to_pylist()})
    columns = ("train_loss", "val_loss", "grad_norm")
    for column, pairs in _deviations(a.to_pylist(), b.to_pylist(), lambda r: r["step"],
                                     columns).items():
        if pairs:
            row, value = max(pairs, key=lambda rd: rd[1])
            result[column] = {"max_relative_deviation": value, "at_step": row["step"],
                              "mean_relative_deviation": sum(d for _, d in pairs) / len(pairs),
                              "n": len(pairs)}
    torch_probes, mlx_probes = torch.read_probes(), mlx.read_probes()
    if torch_probes is not None and mlx_probes is not None:
        by_name: dict[str, tuple[float, int, int]] = {}
        for r, d in _deviations(torch_probes.to_pylist(), mlx_probes.to_pylist(), lambda r: (
                r["step"], r["layer"], r.get("head"), r["name"]), ("value",))["value"]:
            if d >= by_name.get(r["name"], (-1.0,))[0]:
                by_name[r["name"]] = (d, r["step"], r["layer"])
        result["probes"] = {name: {"max_relative_deviation": d, "at_step": step, "layer": layer}
                            for name, (d, step, layer) in sorted(by_name.items())}
    summaries = {"mlx": mlx.summary_record(), "torch": torch.summary_record()}
    result["status"] = {k: s.get("status") for k, s in summaries.items()}
    result["tokens_per_second"] = {k: s.get("tokens_per_second") for k, s in summaries.items()}
    result["judgement"] = judge(result)
    return result


# The judgement of a spot check: max relative deviation over the common steps (CPU float32
# measured 7e-5 in training loss over 100 steps) and the same outcome (completed / diverged).
TOLERANCES = {"train_loss": 1e-3, "val_loss": 1e-3, "grad_norm": 1e-2}


def judge(comparison: dict) -> dict:
    failures = []
    if not comparison.get("steps_compared"):
        failures.append("no common steps to compare")
    for column, tolerance in TOLERANCES.items():
        deviation = comparison.get(column, {}).get("max_relative_deviation")
        if deviation is not None and not deviation <= tolerance:
            failures.append(f"{column} deviates {deviation:.2e} > {tolerance:g} at step "
                            f"{comparison[column]['at_step']}")
    status = comparison.get("status", {})
    if status.get("mlx") != status.get("torch"):
        failures.append(f"outcome differs: mlx {status.get('mlx')}, torch {status.get('torch')}")
    return {"pass": not failures, "tolerances": TOLERANCES, "failures": failures}


def format_comparison(comparison: dict) -> str:
    lines = [(f"torch vs mlx over {comparison['steps_compared']} steps "
              f"(relative: |torch - mlx| / |mlx|; same data: {comparison['same_data']})")]
    for column in ("train_loss", "val_loss", "grad_norm"):
        if column in comparison:
            c = comparison[column]
            lines.append(f"  {column:<10} max {c['max_relative_deviation']:.2e} at step "
                         f"{c['at_step']}, mean {c['mean_relative_deviation']:.2e} "
                         f"({c['n']} values)")
    for name, c in comparison.get("probes", {}).items():
        lines.append(f"  probe {name}: max {c['max_relative_deviation']:.2e} "
                     f"(step {c['at_step']}, layer {c['layer']})")
    judgement = comparison["judgement"]
    lines.append("spot check: " + ("PASS" if judgement["pass"] else "FAIL: "
                                   + "; ".join(judgement["failures"]))
                 + " (tolerances: " + ", ".join(f"{k} {v:g}" for k, v in TOLERANCES.items())
                 + " max relative deviation, same outcome)")
    speeds = comparison.get("tokens_per_second", {})
    if speeds.get("torch"):
        mlx_speed = f"{speeds['mlx']:,.0f}" if speeds.get("mlx") else "?"
        lines.append(f"  tokens/s   torch {speeds['torch']:,.0f}, mlx {mlx_speed}")
    return "\n".join(lines)


USAGE = f"""usage: python -m crosscheck spot-check RUN_DIR [device=auto|cuda|mps|cpu] [data=PATH]

Re-trains the MLX run in RUN_DIR with backend=torch from the same initial weights and batches
into its torch twin's folder beside it (same run-log schema, plus {COMPARISON}) and judges
the agreement against stated tolerances. data= points at the corpus when it moved."""


def cli(argv: list[str]) -> int:
    if not argv or "=" in argv[0]:
        raise UsageError(USAGE.splitlines()[0])
    options = split_key_values(argv[1:])
    unknown = sorted(options.keys() - set(OPTIONS))
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    out, summary = spot_check(argv[0], options.get("device", "auto"), options.get("data"))
    print(f"run folder: {out}  status: {summary['status']}")
    judgement = (files.read_json(RunFolder(out).comparison_file) or {}).get("judgement") or {}
    return 0 if judgement.get("pass") else 1
