"""The bench's report as Markdown tables (bench.md)."""

from __future__ import annotations

from ..forecast import BENCH_KEY, NIGHT_HOURS

LABEL = {"mlx": "MLX", "torch": "PyTorch"}


def median_range(s: dict | None, fmt: str = "{:,.0f}", unit: str = "") -> str:
    if not s:
        return "-"
    text = fmt.format(s["median"]) + unit
    return text if s["n"] == 1 else f"{text} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def ratio_text(s: dict | None) -> str:
    return median_range(s, "{:.2f}", "x")


def hours_text(hours: float, unit: str) -> str:
    """Two significant digits below 100 hours, whole numbers above."""
    def number(x: float) -> str:
        return f"{x:.2g}" if x < 100 else f"{x:,.0f}"

    if unit == "nights":
        return f"{number(hours)} h ({number(hours / NIGHT_HOURS)} nights)"
    return f"{number(hours)} GPU-h"


def markdown(report: dict) -> str:
    lines = machine_lines(report) + speed_table(report)
    return "\n".join(lines + processes_table(report) + where_to_run_table(report["where_to_run"]))


def machine_lines(report: dict) -> list[str]:
    m, cfg = report["machine"], report["config"]
    load, after, during = (m.get(k) for k in ("load_average", "load_average_after",
                                              "load_before_each"))
    matmul, facts = report.get("matmul_gflops", {}), report.get("facts", {})
    versions = [f"MLX {facts['mlx']['mlx']} on {facts['mlx']['device']} (BLAS "
                f"{facts['mlx']['blas']})" if "mlx" in facts else "",
                f"PyTorch {facts['torch']['torch']} on {facts['torch']['device']}, "
                f"{facts['torch']['threads']} threads" if "torch" in facts else ""]
    return [
        f"Machine: {m['platform']}, {m['cpu'] or 'CPU unknown'}, {m['cpus']} CPUs; "
        + "; ".join(v for v in versions if v)
        + (f"; 1-minute load average {load[0]:.2f} at the start" if load else "")
        + (f", {min(during):.2f}-{max(during):.2f} before each measurement (the bench's own "
           f"processes included)" if during else "")
        + (f", {after[0]:.2f} at the end" if after else "") + ".",
        f"Float32 matmul peak (2048^3, best of 3): numpy {report['sgemm_gflops']:.0f} GFLOP/s"
        + "".join(f", {LABEL[b]} {g:.0f}" for b, g in matmul.items()) + ".",
        f"Command: `{report['command']}`. Each value: the median of {cfg['rounds']} round(s) "
        f"(range in brackets); each measurement a fresh process running the run's own engine: "
        f"{cfg['warmup']} warm-up steps, then timed steps for about {cfg['seconds']:g} s (at "
        f"least {cfg['min_steps']}), read back every log_every steps as a run does. Ratios: "
        "the median (range) of the per-round ratios.",
    ]


def speed_table(report: dict) -> list[str]:
    shapes, backends = report["shapes"], report["backends"]
    both = sorted(backends) == ["mlx", "torch"]
    head = (["shape", "params", "MFLOPs/token"] + [f"{LABEL[b]} tok/s" for b in backends]
            + ["PyTorch / MLX"] * both
            + [f"{LABEL[b]} GFLOP/s (share of sgemm peak)" for b in backends]
            + [f"{LABEL[b]} probe / eval overhead" for b in backends])
    lines = ["", "The shapes (each preset's model at its largest depth):", "",
              "| shape | depth | d_model | heads | block | batch | vocabulary |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in shapes.items():
        s = e["shape"]
        lines.append(f"| {name} | {s['depth']} | {s['d_model']} | {s['n_heads']} | "
                     f"{s['block_size']} | {s['batch_size']} | {s['vocab']:,} |")
    lines += ["", "Train step, one process:", "", "| " + " | ".join(head) + " |",
              "|" + " --- |" * len(head)]
    for name, e in shapes.items():
        row = [name, f"{e['params']['total'] / 1e6:.2f}M", f"{e['flops_per_token'] / 1e6:.1f}"]
        row += [median_range(e["tokens_per_s"].get(BENCH_KEY[b])) for b in backends]
        if both:
            row += [ratio_text(e["ratios"].get("torch-1/mlx-plain-1"))]
        for b in backends:
            k = BENCH_KEY[b]
            row += [f"{e['gflops'][k]:.1f} ({e['share_of_sgemm_peak'][k]:.0%})"
                    if k in e["gflops"] else "-"]
        for b in backends:
            o = e["overheads"].get(b)
            row += [f"{o['probe_overhead']:.1%} / {o['eval_overhead']:.1%}" if o else "-"]
        lines.append("| " + " | ".join(row) + " |")
    if any(e["overheads"] for e in shapes.values()):
        lines += ["", "Overhead: one probe call (measure, snapshot, update_stats) per probe_every "
                      "steps and one evaluation (eval_batches batches) per eval_every steps, at "
                      "each preset's own intervals, as a share of its training time."]
    return lines


def processes_table(report: dict) -> list[str]:
    k = report["config"]["parallel"]
    rows, fastest = [], []
    for name, e in report["shapes"].items():
        variants = e["variants"]
        if len(variants) <= len(report["backends"]):
            continue  # one setting per backend: the first table has it all
        best = max((key for key, s in e["tokens_per_s"].items() if s),
                   key=lambda key: e["tokens_per_s"][key]["median"], default=None)
        if best:
            v = variants[best]
            fastest.append(f"{name}: {v['engine']}, {v['processes']} process(es) "
                           f"({e['tokens_per_s'][best]['median']:,.0f} tok/s)")
        for key, v in variants.items():
            if v["processes"] != 1:
                continue
            many = key.rsplit("-", 1)[0] + f"-{k}"
            rows.append(
                f"| {name} | {v['engine']} | {median_range(e['tokens_per_s'].get(key))} | "
                f"{median_range(e['tokens_per_s'].get(many))} | "
                f"{ratio_text(e['ratios'].get(f'{many}/{key}'))} | "
                f"{ratio_text(e['ratios'].get(f'{key}/mlx-plain-1'))} |")
    if not rows:
        return []
    return ["", f"Processes at once and MLX's CPU builds (tokens/s, in total for {k} processes; "
                "tuned = MLX's CPU kernels built with -march=native, MLX_GPT_CPU_JIT=native):", "",
            f"| shape | engine | 1 process | {k} at once | {k} / 1 process | 1 process vs MLX "
            f"plain |", "| --- | --- | --- | --- | --- | --- |", *rows,
            "", "Fastest: " + "; ".join(fastest) + "."]


def where_to_run_table(w: dict) -> list[str]:
    p = w["plan"]
    lines = ["", f"Where to run the study: the study preset's run is {p['budget_tokens']:,} "
                 f"training tokens plus its evaluations ({p['cost_tokens']:,.0f} "
                 "token-equivalents) "
                 f"at depth {p['depth']} ({p['flops_per_token'] / 1e6:.1f} MFLOPs per token); one "
                 f"depth is {p['runs_per_depth']} runs ({p['arms']} arms x {p['lrs']} LRs x "
                 f"{p['seeds']} seeds), the whole study {p['depths']} depths, each counted at "
                 f"depth {p['depth']}'s cost, one run at a time (a night: {NIGHT_HOURS} h):", "",
             "| platform | backend | tokens/s at the study shape | source | one run | one depth "
             f"({p['runs_per_depth']} runs) | whole study ({p['runs_per_depth'] * p['depths']} "
             "runs) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in w["rows"]:
        speed = f"{r['tokens_per_s']:,.0f}"
        if "range" in r:
            speed += f" ({r['range'][0]:,.0f}-{r['range'][1]:,.0f})"
        lines.append(f"| {r['platform']} | {r['backend']} | {speed} | {r['source']} | "
                     f"{hours_text(r['hours_per_run'], r['unit'])} | "
                     f"{hours_text(r['hours_per_depth'], r['unit'])} | "
                     f"{hours_text(r['hours_whole_study'], r['unit'])} |")
    return lines
