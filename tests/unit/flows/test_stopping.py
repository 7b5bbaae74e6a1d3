"""How a command stops: the SIGTERM clock ends a process whose unwinding does not (a handler that swallows the
signal, as Prefect's does during a flow run, or a call stuck on a frozen server), with exit 143 and its sentence
about UNWIND_S after the signal; a SIGTERM that unwinds at once gets the sentence from the exception; in-process
(not the command) no clock runs. Each case runs in a child process of its own: a hard exit must not end pytest."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from runtime.timeouts import UNWIND_S

ROOT = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent("""
    import signal, sys, time
    from flows.cli import stopping
    if sys.argv[1] == "command":
        stopping.as_command()
    with stopping.sigterm_unwinds("estimate", lambda: None):
        if sys.argv[2] == "swallow":            # unwinding that never comes: the signal is taken and dropped
            signal.signal(signal.SIGTERM, lambda *a: None)
        try:                                      # "ready" inside: the signal may come while it is printed
            print("ready", flush=True)
            time.sleep(60)
        except stopping.Terminated as exc:
            print(f"unwound: {exc}", file=sys.stderr, flush=True)
            sys.exit(143)
    sys.exit(3)
""")


def _run(mode: str, how: str, wait_s: float = UNWIND_S + 20) -> tuple[int, float, str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode, how], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    sent = time.monotonic()
    child.send_signal(signal.SIGTERM)
    try:
        _, err = child.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        return -1, time.monotonic() - sent, err
    return child.returncode, time.monotonic() - sent, err


def test_the_clock_ends_a_command_whose_unwinding_never_comes():
    code, seconds, err = _run("command", "swallow")
    # the clock starts when the signal arrives: UNWIND_S, plus a second for a loaded machine's scheduling
    assert code == 143 and UNWIND_S - 0.5 <= seconds <= UNWIND_S + 5, (code, seconds, err)
    assert "labelshift estimate: stopped by SIGTERM; the run was stopped: nothing was committed" in err


def test_a_sigterm_that_unwinds_carries_the_sentence_and_needs_no_clock():
    code, seconds, err = _run("command", "unwind")
    assert code == 143 and seconds < UNWIND_S / 2, (code, seconds, err)
    assert "unwound: \nlabelshift estimate: stopped by SIGTERM" in err


def test_in_process_no_clock_runs():
    code, seconds, err = _run("library", "swallow", wait_s=UNWIND_S + 3)
    assert code == -1, (code, seconds, err)          # still running past the clock's time: killed here


WATCHED = textwrap.dedent("""
    import sys
    from flows.cli import stopping
    stopping.as_command()
    try:
        with stopping.watched(sys.argv[1], lambda reason: f"stopped: {reason}"):
            raise RuntimeError("Failed to reach API at " + sys.argv[1] + "\\nmore lines")
    except stopping.ServerLost as exc:
        print(f"lost: {exc}")
    except RuntimeError as exc:
        print(f"raised as it was: {exc.args[0]}")
""")


def test_an_error_of_the_flow_when_the_server_is_gone_becomes_the_lost_server_sentence(health_server):
    """A flow whose Prefect client fails (the server killed as the command starts: Prefect raises "Failed to reach
    API" before the watch's seconds have passed): when the server does not answer, the error becomes ServerLost with
    the command's sentence and its first line (exit 75, no traceback); when it answers, the error is raised as it
    was."""
    from runtime.processes import free_ports

    closed = f"http://127.0.0.1:{free_ports(1)[0]}/api"
    out = subprocess.run([sys.executable, "-c", WATCHED, closed], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    assert out.strip() == (f"lost: stopped: the Prefect server at {closed} does not answer (RuntimeError: Failed to "
                           f"reach API at {closed})"), out

    alive = f"http://127.0.0.1:{health_server.server_port}/api"
    out = subprocess.run([sys.executable, "-c", WATCHED, alive], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout
    assert out.strip().startswith(f"raised as it was: Failed to reach API at {alive}"), out


def test_a_sigterm_before_the_run_unwinds_too():
    """From as_command on, SIGTERM raises Terminated (exit 143 with a sentence) instead of ending the process on
    the spot, also before a run's own handler is installed (seen: exit -15 as the command started)."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from flows.cli import stopping
        stopping.as_command()
        try:
            print("ready", flush=True)
            time.sleep(60)
        except stopping.Terminated:
            print(stopping.stopped_sentence("report", "stopped by SIGTERM").strip(), file=sys.stderr)
            sys.exit(143)
    """)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 143 and err.strip() == "labelshift report: stopped by SIGTERM.", (child.returncode, err)
