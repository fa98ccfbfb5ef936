"""The bench's numbers: medians and ranges over rounds, and ratios of two measurements taken
side by side in each round."""

from __future__ import annotations

import statistics


def spread(values: list[float | None]) -> dict | None:
    """{"median", "min", "max", "n"} of the values that exist; None if none does."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def paired_ratio(a: list[float | None], b: list[float | None]) -> dict | None:
    """b / a per round (both measured in that round), summarised by spread."""
    return spread([y / x for x, y in zip(a, b) if x and y is not None])


def summarise(entry: dict, sgemm: float) -> None:
    """Medians, ranges, FLOP/s and the ratios of one shape's samples (in place)."""
    samples = entry["samples"]
    entry["tokens_per_s"] = {k: spread(v) for k, v in samples.items()}
    entry["gflops"] = {k: s["median"] * entry["flops_per_token"] / 1e9
                       for k, s in entry["tokens_per_s"].items() if s}
    entry["share_of_sgemm_peak"] = {k: g / sgemm for k, g in entry["gflops"].items()}
    ratios = {}
    base = "mlx-plain-1"
    for key, v in entry["variants"].items():
        if v["processes"] == 1 and key != base and base in samples:
            ratios[f"{key}/{base}"] = paired_ratio(samples[base], samples[key])
        one = key.rsplit("-", 1)[0] + "-1"
        if v["processes"] > 1 and one in samples:
            ratios[f"{key}/{one}"] = paired_ratio(samples[one], samples[key])
    entry["ratios"] = ratios
