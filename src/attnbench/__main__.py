"""``python -m attnbench`` and the ``attnbench`` command (``entry``).

The command's modules import torch and pandas, a second or more: a Ctrl-C then printed Python's traceback of the
import (``KeyboardInterrupt``). ``entry`` imports them inside its own handler, so that it is one line and exit
code 130, as a Ctrl-C in a command is (``attnbench`` itself imports nothing heavy: its names are lazy)."""

from __future__ import annotations

import sys


def entry() -> int:
    try:
        from attnbench.cli import main
    except KeyboardInterrupt:
        print("attnbench: interrupted while starting; nothing was written", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(entry())
