"""The laptop's memory of profiling sessions: SQLite store, artifacts, cost, compare, export."""
