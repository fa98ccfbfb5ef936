"""Study analysis: reads runs/ (Parquet, JSON) only, never the trainers; `from analysis import
load_study` is the entry point for scripts (docs/analysis.md). Loaded on first use, so a command
that needs none of the analysis (`advise`) starts fast."""

__all__ = ["load_study"]


def __getattr__(name: str):
    if name == "load_study":
        from .study import load_study

        return load_study
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
