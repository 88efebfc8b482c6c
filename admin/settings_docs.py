"""``python -m basalt.admin.settings_docs docs/configuration.md``: rewrite its settings tables.

Each block between ``<!-- settings: NAME -->`` and ``<!-- end settings -->``
becomes the table of every setting of the service ``basalt NAME``
(:func:`basalt.services.config.render_docs` over :func:`basalt.admin.cli.service_specs`:
the services' own declarations, so the tables cannot drift; a test checks
they are current). Here, beside the command line that runs every service,
rather than under ``basalt.services``, which does not know the admin service.
"""

from __future__ import annotations

import sys
from pathlib import Path

from basalt.admin.cli import service_specs
from basalt.services.config import render_docs


def rewrite(doc: Path) -> bool:
    """Rewrite ``doc``'s settings tables; whether anything changed."""
    text = doc.read_text()
    rendered = render_docs(text, service_specs())
    if rendered != text:
        doc.write_text(rendered)
    return rendered != text


if __name__ == "__main__":
    for name in sys.argv[1:] or ["docs/configuration.md"]:
        rewrite(Path(name))
