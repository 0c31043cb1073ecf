"""``gpuws mcp``: the Model Context Protocol face of the laptop engine, for coding agents.

A face like the CLI and the TUI: it drives :mod:`gpuws.live` and reads the session store
through :mod:`gpuws.sessions`; it never imports the pod's agent. What an agent may do is
bounded by the person who starts it (:mod:`.policy`), and every call is recorded
(:mod:`.actions`).
"""
