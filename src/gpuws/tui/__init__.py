"""The Textual workstation. Nothing outside ``gpuws.tui`` imports this package."""
