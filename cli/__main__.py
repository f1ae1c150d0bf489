"""``python -m worldserve.cli``: the ``worldserve`` command."""

from worldserve.cli.main import main

main()
