"""The one thing pyproject.toml does not say: the optional C extensions.

``agents/_scan.c`` scans dense proxy lists; ``reducers/_admit.c`` answers the fold's
admission question for proxy reports; ``reducers/_fastfold.c`` folds a known proxy
confirmed again and a location; ``ops/nats/_frames.c`` parses the stream reader's data frames.
``optional=True``: without a C compiler the install still succeeds, and each falls back
to its Python twin, slower (``ppf bench extract`` and ``ppf bench fold`` report which
ran). Declared here rather than in pyproject.toml, where setuptools still calls
ext-modules experimental.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("agents._scan", ["agents/_scan.c"], optional=True),
        Extension("reducers._admit", ["reducers/_admit.c"], optional=True),
        # The latency EMA must round as Python's does: no fused multiply-add (aarch64
        # would contract a * x + b * y into one, and the projection's digest would move).
        Extension(
            "reducers._fastfold",
            ["reducers/_fastfold.c"],  # which includes its parts, reducers/_fastfold_parts/*.c
            depends=[
                f"reducers/_fastfold_parts/{p}.c"
                for p in ("common", "confirm", "fail", "locate", "located_wire", "batch")
            ],
            optional=True,
            extra_compile_args=["-ffp-contract=off"],
        ),
        Extension("ops.nats._frames", ["ops/nats/_frames.c"], optional=True),
    ]
)
