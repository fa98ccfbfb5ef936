"""`python -m qkstudy sweep [key=value ...]`: arms (QK-norm and rival logit controls) x learning
rate x seed (x depth) grids (docs/sweeps.md).

A sweep is a preset (a frozen SweepConfig, config.py) crossed with key=value overrides. It
expands to independent TrainConfigs, each content addressed by its run_id, trained one after
another under <runs_dir>/<name>/<run_id>/ (run.py): finished runs are skipped, interrupted ones
resume, a run held by another process (its lock) is passed over and looked at again, and a run
that raises is recorded as failed while the sweep goes on. After the grid, the results call for
boundary refinement (refine.py), threshold bisection and adaptive seeds (adaptive.py), each a
pure function of the results on disk, so any process that sees the same results asks for the
same next run. plan.py prints the plan, cli.py is the command, slurm.py writes job arrays.
"""

from .cli import USAGE, cli
from .config import PRESETS, grid, parse_sweep_config

__all__ = ["PRESETS", "USAGE", "cli", "grid", "parse_sweep_config"]
