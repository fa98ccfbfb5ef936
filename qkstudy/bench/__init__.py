"""`python -m qkstudy bench`: every backend's training step, measured the same way, side by side:
plan.py (keys, variants, checks), step.py (one measurement in a fresh process), shapes.py (the
presets' models and FLOPs), measure.py (rounds, medians, ranges, ratios), tables.py (bench.md).
"""
