"""`python -m naiad` runs the command line."""

from naiad.cli.main import main

raise SystemExit(main())
