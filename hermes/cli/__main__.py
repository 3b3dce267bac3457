"""``python -m hermes.cli``: the same as the ``hermes`` script."""

from hermes.cli import main

main()
