"""`python -m qkstudy bench`: every backend's training step, measured the same way, side by side:
cli.py (keys, rounds, report and tables), step.py (one measurement in a fresh process),
shapes.py (the presets' models and FLOPs)."""
