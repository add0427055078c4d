"""What is kept of metric history, and for how long: rollups (10 s / 1 min buckets) and the
retention of raw points around incidents. See docs/design.md "Metric history"."""
