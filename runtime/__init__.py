"""What every command needs: the environment it resolves, the processes it starts, and how it stops (one module
each, docs/architecture.md). This package imports neither ``stack``, ``flows`` nor ``tasks``: they use it.
"""
