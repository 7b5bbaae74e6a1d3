"""The container stack's tooling, run from the repository root as modules (``python3 -m infra.compose_stack up``).

* :mod:`.image` -- ``make image``: the Debian base when missing, then the worker, PostgreSQL and proxy images;
* :mod:`.tls` -- the certificate of the stack's TLS front (a private CA's when the operator brings none);
* :mod:`.compose_stack` -- ``make stack-docker-up`` / ``stack-docker-down``: checks, start, stop;
* :mod:`.stack_e2e` -- ``make stack-e2e``: the end-to-end check of the images and the stack;
* :mod:`.access_probes` -- every door of the stack knocked on with no credentials, wrong ones and each role's.

``image``, ``tls`` and ``compose_stack`` need the standard library only (and :mod:`stack.access`, which does too),
so that they run with any Python 3.11 before ``make setup``; ``stack_e2e`` and ``access_probes`` run in the
project's virtual environment. No package of the code imports this one (infra/README.md).
"""
