"""Widgets of a run: the live panes (tiers, timing, kernels, ncu, rules, output),
the results views (metrics, roofline), diagnoses and artifacts."""
