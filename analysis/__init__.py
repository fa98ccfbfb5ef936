"""Study analysis: reads runs/ (Parquet, JSON) only; never imports the trainers.

`from analysis import load_study` is the entry point for notebooks and scripts (docs/analysis.md).
"""

__all__ = ["load_study"]


def __getattr__(name: str):
    # lazy: `python -m analysis calibrate` and the loaders need not import Altair and the report
    if name == "load_study":
        from .study import load_study

        return load_study
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
