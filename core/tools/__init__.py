"""Measuring tools the CLI and the planner share: the LiteRT reference, output comparison, timing,
calibration and the measured plan search.  Each idea is written once here; commands only render."""
