"""Text for people: pod strings made safe to show (textsafe) and numbers, sizes and
times formatted one way everywhere (humanfmt)."""
