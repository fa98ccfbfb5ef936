"""`python -m qkstudy sweep [key=value ...]`: arms (QK-norm and rival logit controls) x learning rate x seed (x depth) grids.

A sweep is a preset (a frozen `SweepConfig`) crossed with key=value overrides. It expands to a
list of independent `TrainConfig`s, each content addressed by its run_id, and trains them one
after another under <runs_dir>/<name>/<run_id>/:

- finished runs are skipped and interrupted ones resume from their checkpoint (train.train);
- a run held by another process (its lock) is passed over and looked at again at the end, so
  several sweep processes on one runs/ tree share the work and never train a run twice;
- a run that raises is recorded as failed by train.train and the sweep goes on;
- after the grid, boundary refinement bisects (in log space) between the largest stable and the
  smallest diverged LR of each (depth, arm, seed), so the max stable LR is known to within
  `refine_factor`. Every refinement point is a pure function of the results before it, so any
  process (or machine) that sees the same results asks for the same next run.

`--emit-commands` prints each remaining run as a standalone `python -m qkstudy train` command.
"""

from .cli import cli
from .config import PRESETS, SweepConfig, grid, groups, log_grid, parse_sweep_config, run_config
from .plan import param_counts, remaining_runs
from .refine import Outcome, bisect_boundary, boundary, next_midpoint, run_outcome

__all__ = ["PRESETS", "SweepConfig", "Outcome", "bisect_boundary", "boundary", "cli",
           "grid", "groups", "log_grid", "next_midpoint", "param_counts", "parse_sweep_config",
           "remaining_runs", "run_config", "run_outcome"]
