"""Pure helpers for pictures of a run's timeline, shared by the TUI and the export."""
