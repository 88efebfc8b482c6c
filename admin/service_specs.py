"""The service processes ``basalt`` runs, and every setting of each.

Each service's main owns its settings (its ``SPEC``, :mod:`basalt.services.config`);
:data:`SERVICES` names the mains by command, and :func:`service_specs` puts
their settings together with the sections every service shares: what
``--print-config`` prints and docs/configuration.md's tables show. Here, in
the admin package, above both the services and the admin service, so that
``basalt.services`` needs nothing of ``basalt.admin``; the command line
(:mod:`basalt.admin.cli`) wires each as a ``basalt <service>`` group.

``python -m basalt.admin.service_specs docs/configuration.md`` rewrites each
block between ``<!-- settings: NAME -->`` and ``<!-- end settings -->`` with
the table of every setting of ``basalt NAME`` (a test checks they are current).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from basalt.services.config import ServiceSpec


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceCommand:
    """A command that runs a service process until SIGTERM: its ``module`` (a
    ``*main`` module) owns the service's ``SPEC`` of settings and supplies
    ``add_arguments`` and ``serve``; ``service_name`` is its telemetry's
    service.name."""

    module: str
    service_name: str

    def register(self, module: ModuleType, parser: argparse.ArgumentParser) -> None:
        """Add the service's flags to ``parser`` (``module``: the imported main)."""
        from basalt.services import process

        module.add_arguments(parser)
        process.add_common_arguments(parser, self.service_name)
        parser.set_defaults(handler=lambda args, stdout, stderr: process.run(module.serve, args))


#: The service processes, by command.
SERVICES: Mapping[str, ServiceCommand] = {
    "store-node": ServiceCommand("basalt.services.store_node.main", "basalt-store-node"),
    "pull-service": ServiceCommand("basalt.services.pull_service.main", "basalt-pull-service"),
    "admin-service": ServiceCommand("basalt.admin.service_main", "basalt-admin-service"),
}


def service_specs() -> dict[str, ServiceSpec]:
    """Every service's settings (its main's ``SPEC``) with the sections all
    services share (telemetry, TLS, auth), by command. Needs the server extra."""
    from basalt.services import process

    return {
        name: importlib.import_module(command.module).SPEC.with_sections(*process.COMMON_SECTIONS)
        for name, command in SERVICES.items()
    }


def rewrite_docs(doc: Path) -> bool:
    """Rewrite ``doc``'s settings tables; whether anything changed."""
    from basalt.services.config import render_docs

    text = doc.read_text()
    rendered = render_docs(text, service_specs())
    if rendered != text:
        doc.write_text(rendered)
    return rendered != text


if __name__ == "__main__":
    for name in sys.argv[1:] or ["docs/configuration.md"]:
        rewrite_docs(Path(name))
