"""The one thing pyproject.toml does not say: the optional C extensions.

Native code only where it parses a format and has a Python twin that a test checks it
against: ``agents/_scan.c`` scans dense proxy lists; ``eventlog/_frames.c`` parses the
stream reader's data frames. The fold's rules are Python alone (docs/architecture.md).
``optional=True``: without a C compiler the install still succeeds, and each falls back
to its Python twin, slower (``ppf bench extract`` and ``ppf bench fold`` report which
ran). Declared here rather than in pyproject.toml, where setuptools still calls
ext-modules experimental.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("agents._scan", ["agents/_scan.c"], optional=True),
        Extension("eventlog._frames", ["eventlog/_frames.c"], optional=True),
    ]
)
