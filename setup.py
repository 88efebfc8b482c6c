"""Build hook: the package mapping and the one C extension.

Everything else about the distribution is in pyproject.toml.

**One package.** A wheel of Basalt installs one top-level package, ``basalt``,
while the source stays in the folders the user laid out: ``proto/basalt`` is
the package (with the generated ``basalt.v1``), and each folder of
:data:`SOURCE_FOLDERS` is mapped under it (``store/`` is ``basalt.store``).
Sub-packages are found, not listed, so a new one cannot be left out of the
wheel. Editable installs use setuptools' strict mode (``scripts/*.sh``): a
tree of links under ``build/`` that mypy and every other tool read as an
ordinary package.

**The extension.** ``basalt.common._records`` (``common/_records.c``:
the record codec the SDK and the engine share, and the engine's loops) needs only
a C11 compiler and the Python headers; it uses no library beyond libc (the
CRC32 is its own), so a fresh machine builds it with ``pip install``.
"""

from setuptools import Extension, find_packages, setup

#: The folder that is the package ``basalt`` itself (with the generated ``basalt.v1``).
PACKAGE_ROOT = "proto/basalt"

#: Source folder -> the sub-package of ``basalt`` it becomes. With PACKAGE_ROOT, the one
#: list of what the package is built from: scripts/run.sh's reinstall check reads both
#: (as tests/support/packaging.py does, from this file's AST), and the image's build
#: context (.dockerignore) is checked against them by tests/test_packaging.py.
SOURCE_FOLDERS = {
    "common": "common",
    "store": "store",
    "services": "services",
    "admin": "admin",
    "client": "client",
    "pipeline": "pipeline",
}


def _packages() -> tuple[list[str], dict[str, str]]:
    packages = [f"basalt.{p}" for p in find_packages(PACKAGE_ROOT)] + ["basalt"]
    package_dir = {"basalt": PACKAGE_ROOT}
    for folder, name in SOURCE_FOLDERS.items():
        package_dir[f"basalt.{name}"] = folder
        packages.append(f"basalt.{name}")
        packages += [f"basalt.{name}.{p}" for p in find_packages(folder)]
    return sorted(packages), package_dir


PACKAGES, PACKAGE_DIR = _packages()

setup(
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    ext_modules=[
        Extension(
            "basalt.common._records",
            ["common/_records.c"],
            extra_compile_args=[
                "-O3",
                "-std=c11",
                "-D_GNU_SOURCE",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
                "-Wno-missing-field-initializers",
            ],
        )
    ],
)
