"""Study analysis: reads runs/ (Parquet, JSON) only, never the trainers; `from analysis import
load_study` is the entry point for notebooks and scripts (docs/analysis.md)."""

from .study import load_study

__all__ = ["load_study"]
