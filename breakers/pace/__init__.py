"""The pace of a job's ranks: straggler scores (performance layer). See docs/design.md."""
