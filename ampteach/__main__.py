"""`python -m ampteach ...` is the same as the `ampteach` command."""

from .cli import main

raise SystemExit(main())
