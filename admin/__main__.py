"""``python -m admin …``: the same command line as the ``basalt`` console script."""

from __future__ import annotations

from admin.cli import main

raise SystemExit(main())
