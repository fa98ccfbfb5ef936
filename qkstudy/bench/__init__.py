"""`python -m qkstudy bench`: every backend's training step, measured the same way, side by side.

By job: plan.py (the keys, the variants, the checks), step.py (one measurement in a fresh
process: the run's own engine at a preset's shape, `warmup` steps, then about `seconds` of steps
read back every `log_every` steps as a run does), shapes.py (the presets' models and their
FLOPs), measure.py (the rounds, the sgemm peak, medians, ranges and paired ratios), tables.py
(bench.md), cli.py (the command); the hours of the study where to run it: qkstudy/forecast.py.
Each (shape, engine, processes) is measured once per round, the engines of a shape one after the
other; a table gives the median and range over rounds, a ratio the median (and range) of the
per-round ratios. At `cpu_shapes` it also measures `parallel` processes at once and MLX's tuned
CPU build (MLX_GPT_CPU_JIT=native, Linux x86-64) against its plain one.
"""
