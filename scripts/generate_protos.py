"""Regenerate the Python modules of the ``.proto`` contracts under ``proto/``.

Usage (from anywhere; paths are relative to the repository)::

    .venv/bin/python scripts/generate_protos.py            # rewrite proto/basalt/**
    .venv/bin/python scripts/generate_protos.py --out DIR  # write elsewhere (the stale check)

For every ``proto/basalt/**/X.proto`` it writes, next to it: ``X_pb2.py``
(protoc's messages), ``X_pb2.pyi`` (mypy-protobuf's typed stubs),
``X_pb2_grpc.py`` (grpcio-tools' service stubs and servicers) and
``X_pb2_grpc.pyi`` (mypy-protobuf's ``protoc-gen-mypy_grpc``). Files are
compiled with ``-I proto`` so each registers as ``basalt/v1/X.proto`` in
protobuf's process-wide descriptor pool and imports as ``basalt.v1.X_pb2``.

Generated files whose ``.proto`` is gone are deleted, so the tree always
equals a fresh generation. The output depends on the installed grpcio-tools
and mypy-protobuf versions (both are written into the files): regenerate
after upgrading either.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
#: The package tree the contracts live in (``proto/basalt/v1/*.proto``).
PACKAGE_ROOT = PROTO_ROOT / "basalt"
#: Suffixes of the files generated per ``.proto``.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


def proto_files() -> list[Path]:
    """Every ``.proto`` under ``proto/basalt``, relative to ``proto/``, sorted."""
    return sorted(p.relative_to(PROTO_ROOT) for p in PACKAGE_ROOT.rglob("*.proto"))


def is_generated(path: Path) -> bool:
    return path.name.endswith(GENERATED_SUFFIXES)


def generated_files(root: Path) -> list[Path]:
    """The generated files under ``root/basalt``, relative to ``root``, sorted."""
    base = root / "basalt"
    if not base.is_dir():
        return []
    return sorted(p.relative_to(root) for p in base.rglob("*") if p.is_file() and is_generated(p))


def _plugin(name: str) -> Path:
    """A protoc plugin from this interpreter's environment, else from PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return local
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extras (pip install -e '.[dev]')")
    return Path(found)


def generate(out: Path) -> list[Path]:
    """Compile every contract into ``out`` (created if needed); returns the files
    written, relative to ``out``. Raises SystemExit when protoc fails."""
    protos = proto_files()
    if not protos:
        raise SystemExit(f"no .proto files under {PACKAGE_ROOT}")
    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        *(f"--plugin={name}={_plugin(name)}" for name in PLUGINS),
        f"--python_out={out}",
        f"--mypy_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        "--mypy_opt=quiet",
        "--mypy_grpc_opt=quiet",
        *(str(p) for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed (see above)")
    expected = {(p.parent / (p.stem + suffix)) for p in protos for suffix in GENERATED_SUFFIXES}
    for stale in set(generated_files(out)) - expected:
        (out / stale).unlink()
    return sorted(expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=PROTO_ROOT,
        help="directory to write basalt/... into (default: proto/, in place)",
    )
    opts = parser.parse_args(argv)
    written = generate(opts.out.resolve())
    print(f"generated {len(written)} files from {len(proto_files())} .proto files into {opts.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
