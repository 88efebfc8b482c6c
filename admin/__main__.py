"""``python -m admin …``: the same command line as the ``basalt`` console script."""

from __future__ import annotations

from basalt.admin.cli import main

raise SystemExit(main())
