"""Workspaces: a local project mirrored to the pod, content-addressed, and the record of
which code each run measured (``manifest``: the tree; ``gitinfo``: git's view of it;
``sync``: the transfer through the agent's own channel)."""
