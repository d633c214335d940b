"""The sandbox's entry point: `python -m ampteach.grading.checks EXERCISE` runs a notebook for the grader.

See ampteach/grading/checks/driver.py (main); `ampteach grade` starts it inside its sandbox.
"""

import sys

from ampteach.grading.checks.driver import main

sys.exit(main())
