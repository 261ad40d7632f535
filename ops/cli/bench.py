"""``ppf bench ...``: every figure in BENCHMARKS.md comes from one of these.

One parser per benchmark, its flags made from the benchmark's options
(ops/bench/options.py), so each takes its own flags and refuses another's
(``ppf bench fold --tls`` is an error, not a run that ignores it).
"""

from __future__ import annotations

import argparse
import importlib
import re
import typing
from collections.abc import Awaitable, Callable
from typing import Any, cast

import msgspec
from msgspec import inspect as mi

from ops.bench import options as o

__all__ = ["BENCHES", "flags", "fold_run", "register", "stats_run"]

Run = Callable[[Any], Awaitable[dict[str, Any]] | dict[str, Any]]

# In the order ``ppf bench --help`` lists them.
BENCHES: tuple[type[o.Bench], ...] = (
    o.Fold,
    o.Lease,
    o.Query,
    o.Snapshot,
    o.Stats,
    o.Extract,
    o.Check,
    o.Harvest,
    o.Pool,
    o.Ingest,
    o.Serve,
    o.ServeChurn,
    o.Pick,
    o.Sites,
    o.FoldSites,
    o.SiteState,
    o.Read,
    o.Marks,
    o.Quality,
    o.Seed,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bn = sub.add_parser("bench", help="benchmarks (BENCHMARKS.md)")
    what = bn.add_subparsers(dest="what", required=True, metavar="BENCH")
    for options in BENCHES:
        name = re.sub(r"(?<!^)([A-Z])", r"-\1", options.__name__).lower()
        p = what.add_parser(name, help=options.__doc__)
        p.add_argument("--json", action="store_true", help="one JSON object")
        flags(p, options)
        p.set_defaults(run=_runner(options))


def _literal(annotation: Any) -> tuple[Any, ...]:
    """A Literal's values in the order written (msgspec's inspection sorts them), from
    inside an optional or a list."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return next(v for arg in typing.get_args(annotation) if (v := _literal(arg)))


def _fields(options: type[msgspec.Struct]) -> tuple[mi.Field, ...]:
    return cast(mi.StructType, mi.type_info(options)).fields


def _plain(t: mi.Type) -> mi.Type:
    """The type a flag parses: an optional's other type, a metadata's own."""
    if isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.UnionType):
        t = next(u for u in t.types if not isinstance(u, mi.NoneType))
    return t


_PARSE: dict[type[mi.Type], Callable[[str], Any]] = {
    mi.IntType: int,
    mi.FloatType: float,
    mi.StrType: str,
}


def flags(parser: argparse.ArgumentParser, options: type[msgspec.Struct]) -> None:
    """A flag for each field of ``options`` (see ops/bench/options.py)."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    hints = typing.get_type_hints(options)
    for field in _fields(options):
        meta = field.type if isinstance(field.type, mi.Metadata) else None
        extra = dict((meta.extra if meta else None) or {})
        help = (meta.extra_json_schema or {}).get("description") if meta else None
        group = extra.pop("group", None)
        into: Any = parser
        if group is not None:
            if group not in groups:
                groups[group] = parser.add_mutually_exclusive_group()
            into = groups[group]
        kind = _plain(field.type)
        spec: dict[str, Any] = {"help": help, **extra}
        if isinstance(kind, mi.BoolType):
            spec["action"] = "store_true"
        else:
            if spec.pop("append", False):
                spec["action"] = "append"
                kind = kind.item_type  # type: ignore[attr-defined]
            if isinstance(kind, mi.LiteralType):
                spec["choices"] = _literal(hints[field.name])
            elif isinstance(kind, mi.CustomType):
                spec["type"] = kind.cls
            else:
                spec["type"] = _PARSE[type(kind)]
            if field.required:
                spec["required"] = True
            else:
                spec["default"] = field.default
        into.add_argument("--" + field.name.replace("_", "-"), **spec)


def _runner(options: type[o.Bench]) -> Callable[[argparse.Namespace], Awaitable[int]]:
    async def go(args: argparse.Namespace) -> int:
        from ops.bench.fold import print_fold

        names = (f.name for f in _fields(options))
        chosen = options(**{name: getattr(args, name) for name in names})
        module, _, function = options.run.partition(":")
        bench: Run = getattr(importlib.import_module(module), function)
        result = bench(chosen)
        if not isinstance(result, dict):
            result = await result
        print_fold(result, args.json)
        return 0

    return go


async def fold_run(fold: o.Fold) -> dict[str, Any]:
    from ops.collector import for_folding

    for_folding()  # measured as ppf folds (ops/collector.py)
    if fold.rounds:
        from ops.bench.rounds import bench_rounds

        return await bench_rounds(fold)
    if fold.versus and fold.catch_up:
        from ops.bench.catchup import bench_catch_up_versus

        return await bench_catch_up_versus(fold)
    if fold.versus:
        from ops.bench.versus import bench_versus

        return await bench_versus(fold)
    if fold.located:
        from ops.bench.fold import bench_located

        return await bench_located(fold)
    from ops.bench.fold import bench_fold

    return await bench_fold(fold)


async def stats_run(stats: o.Stats) -> dict[str, Any]:
    from ops.bench.singles import bench_singles
    from ops.bench.stats import bench_stats

    out = await bench_stats(stats)
    if stats.singles:
        out["single_events"] = await bench_singles(stats)
    return out
