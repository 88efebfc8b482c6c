"""``python -m basalt.admin …``: the same command line as the ``basalt`` console script."""

from __future__ import annotations

from basalt.admin.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
