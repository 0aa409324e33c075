"""The names inside a sweep's output folder (docs/outputs.md): one folder per point under `points/`, each
with the run's `summary.json`, and the sweep's `summary.parquet` beside them."""

POINTS_DIR = "points"
POINT_SUMMARY_FILE = "summary.json"
SUMMARY_FILE = "summary.parquet"
