"""`python -m ampteach ...` is the same as the `ampteach` command."""

from ampteach.tools.cli import main

raise SystemExit(main())
