"""What is kept of metric history, and for how long: rollups per rank (10 s / 1 min buckets,
kept for months), the raw window and its retention around incidents, and the rollup-aware
reads of the charts. See docs/architecture.md "Metric storage"."""
