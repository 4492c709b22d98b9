"""Builds the optional C extension emu._hotpath with the system compiler (pyproject.toml holds the rest).

The extension uses no Unicorn header and links no Unicorn library: Python hands it the addresses of
Unicorn's public C functions at run time (emu/hotpath/__init__.py). Where it cannot be built (no compiler),
the install still succeeds and the pure-Python implementation runs instead.
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "emu._hotpath",
            sources=sorted(glob("emu/hotpath_src/*.c")),
            depends=sorted(glob("emu/hotpath_src/*.h")),
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
