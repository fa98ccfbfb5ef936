"""Study analysis: reads runs/ (Parquet, JSON) only; never imports the trainers."""
