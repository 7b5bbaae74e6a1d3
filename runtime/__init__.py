"""What every command needs: the environment it resolves, the processes it starts, and how it stops.

* :mod:`.environment` -- every environment variable the project reads and the embedded defaults, resolved into
  one ``Settings``; the one module that reads the environment;
* :mod:`.timeouts` -- every network call's time limit, in one table;
* :mod:`.processes` -- starting a service process, waiting for it, stopping its whole tree;
* :mod:`.lifetime` -- a temporary Prefect server for one command, and processes that end with their parent;
* :mod:`.watchdog` -- the process that ends a command's processes when the command ends, however it ends;
* :mod:`.server_watch` -- noticing that the Prefect server stopped answering during a run;
* :mod:`.worker_guard` -- a Prefect process worker that lets its flow runs end before it stops.

The servers a command may talk to, when they are started apart from it (the local stack, the container stack's
roles), are :mod:`stack`'s. This package imports neither ``stack``, ``flows`` nor ``tasks``: they use it, not the
other way round.
"""
