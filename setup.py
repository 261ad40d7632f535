"""The one thing pyproject.toml does not say: the optional C extension.

``agents/_scan.c`` scans dense proxy lists. ``optional=True``: without a C compiler
the install still succeeds, and ``agents.extract`` applies the same rules as a regex,
slower (``ppf bench extract`` reports which ran). Declared here rather than in
pyproject.toml, where setuptools still calls ext-modules experimental.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("agents._scan", ["agents/_scan.c"], optional=True)])
