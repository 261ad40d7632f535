"""The event catalogue, subjects and codec: the vocabulary every part of ppf shares."""

from events.catalogue import *  # noqa: F403
from events.catalogue import __all__ as _catalogue_all
from events.codec import DecodeError, decode, decode_many, encode, schema
from events.ids import token_sha256, uuid7
from events.subjects import *  # noqa: F403
from events.subjects import __all__ as _subjects_all

__all__ = [
    *_catalogue_all,
    *_subjects_all,
    "DecodeError",
    "decode",
    "decode_many",
    "encode",
    "schema",
    "token_sha256",
    "uuid7",
]
