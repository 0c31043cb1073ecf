"""Widgets of the pod: what it is (GPUs, counters, Python, profilers), its live
telemetry and cost, and the steps of connecting to it."""
