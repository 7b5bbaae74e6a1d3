"""The runtime of every command: the environment it resolves, and the server processes it starts and supervises.

* :mod:`.environment` -- every environment variable the project reads and the embedded defaults, resolved into one
  ``Settings``;
* :mod:`.supervisor` -- ``labelshift stack up|down|status``: SeaweedFS, MLflow and Prefect on loopback;
* :mod:`.processes` -- starting a service process, waiting for it, stopping its whole tree;
* :mod:`.lifetime` -- a temporary Prefect server for one command, and processes that end with their parent;
* :mod:`.watchdog` -- the process that ends a command's processes when the command ends, however it ends.

It imports neither ``flows`` nor ``tasks``: the flows use it, not the other way round.
"""
