"""``python -m lipcast``: the same command line as ``lipcast``."""

from lipcast.cli import main

raise SystemExit(main())
