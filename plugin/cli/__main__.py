"""``python -m workerset_admission.cli``."""

from __future__ import annotations

import sys

from workerset_admission.cli.runner import main

sys.exit(main())
