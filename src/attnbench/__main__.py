import sys

from attnbench.cli import main

sys.exit(main())
