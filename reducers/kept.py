"""How each piece of the fold's state is kept, declared once beside its type in ``State``
(reducers/state.py); the checkpoint, the snapshot, the restore and the meta digest are
derived from the declarations (projections/store.py, projections/core/digest.py).

- ``table(Row, *key)``: a projection of rows, checkpointed row by row, with its own
  part of the digest (the sum of its rows' hashes). The declaration is all a table
  needs: its dirty set (``State.dirty``), its rows' collection, restoration and cancel
  path, and its DuckDB table (the key, ``columns`` for SQL, the row's bytes) follow
  from it (projections/store.py);
- ``kept(new, ...)``: a piece of the meta, kept whole as JSON in every checkpoint and
  counted in the meta digest by its rule: ``ALWAYS``; ``WHILE_ANY`` (left out while
  empty, so a log written before the piece existed keeps its digest); ``when=`` a
  setting (left out until the setting is on); or ``NEVER`` (the fold's position);
- ``derived(new)``: rebuilt from the rest on restore (reducers/indexes.py), never kept;
- ``replica(new)``: this replica's own counts and dirty sets, never kept or digested.

New state goes in a new table or a ``kept(..., digest=WHILE_ANY, later=True)`` piece
(docs/architecture.md §6): every log written before it then replays to the digest, and
snapshots to the bytes, it had.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "ALWAYS",
    "NEVER",
    "WHILE_ANY",
    "Kept",
    "Piece",
    "Table",
    "declared",
    "derived",
    "kept",
    "replica",
    "table",
]

ALWAYS, WHILE_ANY, NEVER = "always", "while any", "never"

_json = msgspec.json.Encoder().encode


def _same(value: Any) -> Any:
    return value


class Piece:
    """One attribute of the state: what a fresh one holds (``new()``)."""

    __slots__ = ("name", "new")

    def __init__(self, new: Callable[[], Any]) -> None:
        self.new = new
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name


class Table(Piece):
    """A projection of rows of ``row``, keyed by the fields ``key``; ``digest``: ALWAYS,
    or WHILE_ANY (a table added after the first logs: left out of the digest, and of a
    snapshot, while it has no row). ``columns``: the row's fields its DuckDB table keeps
    as plain columns beside the key, for SQL; ``whole``: written whole at every
    checkpoint, with no dirty set (a few rows, each touched by most events); ``packed``:
    a snapshot keeps it zlib-packed (projections/snapshot.py)."""

    __slots__ = ("columns", "digest", "key", "key_of", "packed", "row", "whole")

    def __init__(self, row: type[msgspec.Struct], *key: str, **how: Any) -> None:
        super().__init__(dict)
        self.row = row
        self.key = key
        self.digest: str = how.pop("digest", ALWAYS)
        self.columns: tuple[str, ...] = how.pop("columns", ())
        self.whole: bool = how.pop("whole", False)
        self.packed: bool = how.pop("packed", False)
        if how:
            raise TypeError(f"table(): {', '.join(how)} is not a table's")
        # The row's key in its projection: its one key field, or a tuple of them (in C:
        # a restore takes a key of every row).
        self.key_of: Callable[[Any], Any] = operator.attrgetter(*key)

    def key_from(self, values: tuple[Any, ...] | list[Any]) -> Any:
        """A row's key from its leading column values (a stored key, a deleted one)."""
        return tuple(values[: len(self.key)]) if len(self.key) > 1 else values[0]


class Kept(Piece):
    """A piece of the meta; see the module's docstring for ``digest`` and ``when``.
    ``canonical``: its form in the digest; ``stored``: its form in a checkpoint when that
    is not its own (the type, and the conversions there and back)."""

    __slots__ = (
        "canonical",
        "digest",
        "from_stored",
        "later",
        "load_as",
        "position",
        "to_stored",
        "when",
    )

    def __init__(
        self,
        new: Callable[[], Any],
        digest: str,
        when: str,
        canonical: Callable[[Any], Any],
        stored: tuple[Any, Callable[[Any], Any], Callable[[Any], Any]] | None,
        position: bool,
        later: bool,
    ) -> None:
        super().__init__(new)
        self.later = later
        self.digest = digest
        self.when = when
        self.canonical = canonical
        self.position = position
        self.load_as: Any = stored[0] if stored else None  # None: the declared type
        self.to_stored, self.from_stored = (stored[1], stored[2]) if stored else (_same, _same)

    def counts(self, state: Any) -> bool:
        """Whether it is part of the meta digest of ``state`` now."""
        if self.when:
            return bool(getattr(state.settings, self.when))
        if self.digest == WHILE_ANY:
            return bool(getattr(state, self.name))
        return self.digest == ALWAYS

    def dump(self, value: Any) -> str:
        return _json(self.to_stored(value)).decode()

    def load(self, text: str) -> Any:
        return self.from_stored(msgspec.json.decode(text, type=self.load_as))


def table(row: type[msgspec.Struct], *key: str, **how: Any) -> Any:
    """A table of ``row`` keyed by ``key`` (see ``Table`` for ``how``)."""
    return Table(row, *key, **how)


def kept(
    new: Callable[[], Any],
    *,
    digest: str = ALWAYS,
    when: str = "",
    canonical: Callable[[Any], Any] = _same,
    stored: tuple[Any, Callable[[Any], Any], Callable[[Any], Any]] | None = None,
    position: bool = False,
    later: bool = False,
) -> Any:
    """A piece of the meta. ``position``: where the fold is (written first in a
    checkpoint, before the rest in declaration order). ``later``: added after snapshots'
    meta was fixed, so left out of a snapshot while empty (and of the digest: give it
    ``digest=WHILE_ANY``), and an older log's snapshot keeps its bytes."""
    return Kept(new, digest, when, canonical, stored, position, later)


def derived(new: Callable[[], Any]) -> Any:
    return Piece(new)


def replica(new: Callable[[], Any]) -> Any:
    return Piece(new)


def declared(cls: type) -> tuple[Piece, ...]:
    """The pieces ``cls`` declares, in order; each ``Kept`` piece learns its type."""
    hints = typing.get_type_hints(cls)
    pieces = tuple(v for v in vars(cls).values() if isinstance(v, Piece))
    for piece in pieces:
        if isinstance(piece, Kept) and piece.load_as is None:
            piece.load_as = hints[piece.name]
    return pieces
