"""The stacks of servers (Prefect, MLflow, S3) that run apart from any one command; what every command needs is
:mod:`runtime`'s.

* :mod:`.supervisor` -- the local stack without Docker: ``labelshift stack up|down|status`` starts and stops
  SeaweedFS, MLflow and Prefect (and optional workers) on loopback;
* :mod:`.access` -- the container stack's roles (``infra/compose.yaml``): who may do what, the variables holding
  each role's credentials, and what a client sets to come in through the proxy. Standard library only: the
  containers run it at start, and ``infra/compose_stack.py`` imports it with the system Python.

It may import :mod:`runtime`, never the reverse; like :mod:`runtime` it imports neither Prefect, MLflow, ``tasks``
nor ``flows`` (the CLI and the flows use it).
"""
