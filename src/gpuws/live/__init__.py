"""The laptop engine: the one flow of data both faces (TUI, headless commands) use.

See :mod:`gpuws.live.engine` for the path of one event from the pod to a pane.
"""
