"""``python -m flows.cli``: the ``labelshift`` command."""
from flows.cli import command

command()
