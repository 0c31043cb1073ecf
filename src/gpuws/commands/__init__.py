"""Headless commands (doctor, run, attach, ...): the scriptable twins of the TUI flows."""
