"""What the laptop makes of a pod's GPUs: the --gpu forms and their check against
the probe (gpus), and the clocks behind a figure with its caution (clocks)."""
