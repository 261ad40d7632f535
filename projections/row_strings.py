"""The strings a million proxy rows repeat, made once when a snapshot is loaded.

A proxy row's protocols, anonymity, place and the names of the agents and sources that
vouch for it are a few thousand distinct strings across a million rows. The fold keeps
one object per value (``reducers.proxies.SHARED``, the sources' and agents' own names,
``reducers.geo.PLACES``), but msgspec decodes a fresh string for every field of every
row: a million rows loaded from a snapshot took 2.3 GB, 1.2 KB a row of it the
``agents`` and ``sources`` tuples' strings (the gateway so loaded held 2.8 GB, and
holds 1.27 GB with them shared), and their first touch (590,000 page faults) was most
of the decode.

So a snapshot lists the distinct strings of those fields (``gather``, while it is
taken), and the loader decodes the rows as a subclass of ``ProxyRow`` whose fields of
them are ``Literal`` of that list (``decode``): msgspec answers a literal with the
object it holds for it, so each string is made once. The rows are then made
``ProxyRow`` itself (the same fields, the same layout): a subclass would encode to the
same bytes but compare unequal to a ``ProxyRow`` of the same values. A value missing
from the list (a snapshot written otherwise) fails that decoder, and the rows are
decoded plainly instead. Measured on the rows of 1,000,000 proxies: 1.6-2.0 s and
200,000 page faults, against 2.7-3.1 s and 589,000.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Literal, TypeVar

import msgspec

from reducers.state import ProxyRow

__all__ = ["SINGLE", "TUPLES", "decode", "decode_as", "gather"]

SINGLE = ("proto", "anonymity", "https", "country", "as_org", "geo")
TUPLES = ("protos", "agents", "sources", "failed_by")
_S = TypeVar("_S", bound=msgspec.Struct)
_single = attrgetter(*SINGLE)
_tuples = attrgetter(*TUPLES)


def gather(into: set[str], rows: Sequence[ProxyRow]) -> None:
    """Add the strings of ``rows``' repeated fields to ``into``."""
    into.update(chain.from_iterable(map(_single, rows)))
    into.update(chain.from_iterable(chain.from_iterable(map(_tuples, rows))))


def decode(raw: msgspec.Raw, strings: list[str]) -> tuple[list[ProxyRow], bool]:
    """The rows of a table of proxy rows, and whether they share ``strings`` (False: a
    value was not among them, or there were none, and each row has its own)."""
    rows, shared = decode_as(ProxyRow, raw, strings)
    if shared:
        for row in rows:
            row.__class__ = ProxyRow
    return rows, shared


def decode_as(
    base: type[_S], raw: msgspec.Raw | bytes, strings: list[str]
) -> tuple[list[_S], bool]:
    """A table of proxy rows decoded as ``base`` (a Struct of some of a row's fields),
    and whether its repeated fields took their strings from ``strings`` (then the rows
    are of a subclass of ``base``; False: a value was not there, or there were none,
    and each row has strings of its own)."""
    if strings:
        try:
            return _sharing(base, tuple(strings)).decode(raw), True
        except msgspec.ValidationError:
            pass  # a value the list lacks; a damaged table fails the plain decode too
    return msgspec.msgpack.decode(raw, type=list[base]), False  # type: ignore[valid-type]


def _sharing(base: type[_S], strings: tuple[str, ...]) -> msgspec.msgpack.Decoder[list[_S]]:
    """A decoder of ``base`` as a subclass whose repeated fields are ``Literal`` of
    ``strings`` (the same fields in the same order, their defaults kept)."""
    literal: Any = Literal[strings]
    kinds = {**dict.fromkeys(SINGLE, literal), **dict.fromkeys(TUPLES, tuple[literal, ...])}
    fields = [
        (f.name, kinds[f.name])
        if f.default is msgspec.NODEFAULT
        else (f.name, kinds[f.name], f.default)
        for f in msgspec.structs.fields(base)
        if f.name in kinds
    ]
    sharing = msgspec.defstruct(f"Sharing{base.__name__}", fields, bases=(base,), gc=False)
    return msgspec.msgpack.Decoder(list[sharing])  # type: ignore[valid-type]
