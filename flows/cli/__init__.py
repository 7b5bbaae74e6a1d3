"""The ``labelshift`` command (``labelshift --help`` lists its subcommands).

One module per subcommand; each registers its parser and handler, and shares only :mod:`flows.cli._common`. The
commands that run a flow (``reproduce``, ``estimate``) build their options from the flow's parameter model in
:mod:`flows.params`. Prefect and MLflow are imported only after the environment is set up (:mod:`runtime.environment`),
because Prefect reads its settings once, at import; ``--help`` and parameter errors therefore answer without
importing them.
"""
from __future__ import annotations

import argparse
import sys

from runtime import environment as settings_mod
from flows.cli import alerts, data, estimate, reference, report, reproduce, serve, where, worker
from flows.cli._common import PROG, UsageError, add_common
from flows.cli.reproduce import parameters_from_args
from flows.cli.stopping import AFTER_STOP, EXIT_SERVER_LOST, EXIT_TERMINATED, ServerLost, Terminated, \
    as_command, finish, tell

__all__ = ["main", "command", "build_parser", "PROG", "UsageError", "parameters_from_args"]



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Label shift estimation after Garg et al., 'A Unified View of Label Shift Estimation' "
                    "(NeurIPS 2020): the paper's experiments as Prefect flows, tracked in MLflow.",
        epilog=f"Run '{PROG} <command> --help' for a command's options. State goes under ./.labelshift "
               f"(or ${settings_mod.ENV_HOME}, or --home) unless {settings_mod.ENV_PREFECT_API_URL}, "
               f"{settings_mod.ENV_TRACKING_URI} or {settings_mod.ENV_STORE} point elsewhere.")
    add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    reproduce.register(sub)
    serve.register(sub)
    where.register(sub)
    data.register(sub)
    report.register(sub)
    estimate.register(sub)
    reference.register(sub)
    alerts.register(sub)
    worker.register(sub)
    from stack import supervisor        # `labelshift stack` is registered by the local stack's own module

    supervisor.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    handler = getattr(args, "handler", None) or getattr(args, "func", None)
    if handler is None:
        parser.parse_args([args.command, "--help"])
        return 2
    name = f"{PROG} {_command_path(parser, sys.argv[1:] if argv is None else argv) or args.command}"
    try:
        return int(handler(args) or 0)
    except UsageError as exc:
        sub = name
        print(f"{sub}: error: {exc}\nRun '{sub} --help' for the options.", file=sys.stderr)
        return 2
    except ServerLost as exc:
        tell(str(exc))
        return EXIT_SERVER_LOST
    except Terminated as exc:
        tell(str(exc) or f"\n{PROG} {args.command}: stopped by SIGTERM"
             + (" before its run started: nothing was committed." if args.command in AFTER_STOP else "."))
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from flows.cli.refusals import refusal_message
        from labelshift.errors import LabelShiftError

        verbose = getattr(args, "verbose", False)
        refused = refusal_message(exc)
        if refused and not verbose:
            print(f"{name}: error: {refused}", file=sys.stderr)
            return 1
        if isinstance(exc, LabelShiftError) and not verbose:
            print(f"{name}: error: {exc}", file=sys.stderr)
            return 1
        raise


def _command_path(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """The (sub)command words of ``argv`` as the parser reads them: "estimate", "reference register"."""
    words = []
    for token in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None:
            break
        if token in sub.choices:
            words.append(token)
            parser = sub.choices[token]
    return " ".join(words)


def command() -> None:
    """The ``labelshift`` program: :func:`main` as the process itself, whose exit is bounded
    (:func:`flows.cli.stopping.finish`)."""
    as_command()
    code = 1
    try:
        code = main()
    except Terminated:                 # SIGTERM before a subcommand was running (while its options were read)
        tell(f"\n{PROG}: stopped by SIGTERM.")
        code = EXIT_TERMINATED
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    finally:                 # also after an error with its traceback: the exit stays bounded
        code = finish(code, PROG)
    sys.exit(code)
