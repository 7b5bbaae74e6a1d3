"""The local stack: the settings every command resolves, and the supervision of the server processes it starts.

* :mod:`.settings` -- every environment variable the project reads, resolved into one ``Settings``;
* :mod:`.supervisor` -- ``labelshift stack up|down|status``: SeaweedFS, MLflow and Prefect on loopback;
* :mod:`.processes` -- starting a service process, waiting for it, stopping its whole tree;
* :mod:`.lifetime` -- a temporary Prefect server for one command, and processes that end with their parent;
* :mod:`.watchdog` -- the marker that tells this project's processes from others.

It imports neither ``flows`` nor ``tasks``: the flows use it, not the other way round.
"""
