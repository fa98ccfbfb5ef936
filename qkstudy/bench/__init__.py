"""`python -m qkstudy bench`: every backend's training step, measured the same way, side by side.

The package, by job: plan.py (the keys, the variants, the checks), step.py (one measurement in a
fresh process), shapes.py (the presets' models and their FLOPs), measure.py (the rounds),
stats.py (medians, ranges, paired ratios), machine.py (sgemm peak, load), forecast.py (where to
run the study), tables.py (bench.md), cli.py (the command).

Every number comes from one kind of measurement (step.py): a fresh process builds the run's own
engine (backend=mlx: mlx_gpt; backend=torch: torch_ref) at a preset's shape (shapes.py), takes
`warmup` steps, then times enough steps for about `seconds`, read back every `log_every` steps
as a run does. Each (shape, engine, processes) is measured once per round, the engines of one shape one after the other, in `rounds` rounds; a table gives the
median and the range, and every ratio is the median (and range) of the per-round ratios of two
measurements taken side by side. What is measured:

- at `shapes` (default demo, mini, study): tokens/s of each backend (MLX with its plain CPU
  kernel build, as a run uses by default; PyTorch as `backend=torch device=auto` runs), their
  ratio, achieved FLOP/s (shapes.py) and its share of this machine's sgemm peak (numpy, measured
  first), and in round 1 the cost of evaluation and probes at the preset's intervals;
- at `cpu_shapes` (default demo, mini) also: `parallel` processes at once (their total), and
  MLX's tuned CPU build (MLX_GPT_CPU_JIT=native, Linux x86-64) against its plain one;
- "where to run the study": hours per run of the study preset (its token budget and
  evaluations, qkstudy/sweep/plan.py run_cost_tokens), per depth and for the whole grid, from
  the study-shape speeds measured here and, for machines not measured here, estimates from FLOPs
  (an assumed share of the vendor's peak, stated in each row).

The tables print and are written to <out>/bench.md, every sample to <out>/bench.json.
"""
