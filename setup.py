"""Build hook for the one C extension, store._records (store/_records.c).

Everything else about the distribution is in pyproject.toml. The extension
needs only a C11 compiler and the Python headers; it uses no library beyond
libc (the CRC32 is its own), so a fresh machine builds it with `pip install`.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "store._records",
            ["store/_records.c"],
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
    ]
)
