"""A page as the edges read it for a verdict: its first bytes after its
``Content-Encoding`` (gzip, deflate, br), at most ``HEAD_BYTES`` of it however well it
was compressed. An edge module, as ``mint.py`` is: the core never reads pages."""

from __future__ import annotations

import zlib

import brotli

from events.sites import HEAD_BYTES

__all__ = ["readable"]


def readable(head: bytes, encoding: str) -> bytes:
    """``head`` (a body's first bytes, perhaps cut) decoded by ``encoding``; as it came
    when it has none, or one this does not know, or does not decode (what decodes
    before the cut is kept)."""
    coding = encoding.strip().lower()
    if not head or coding in ("", "identity"):
        return head
    try:
        if coding in ("gzip", "x-gzip", "deflate"):
            # gzip's header, or zlib's (deflate as most servers send it), told apart.
            wbits = 47 if coding != "deflate" else 15
            try:
                return zlib.decompressobj(wbits).decompress(head, HEAD_BYTES)
            except zlib.error:
                if coding != "deflate":
                    raise
                return zlib.decompressobj(-15).decompress(head, HEAD_BYTES)  # raw deflate
        if coding == "br":
            page: bytes = brotli.Decompressor().process(head, output_buffer_limit=HEAD_BYTES)
            return page[:HEAD_BYTES]
    except (zlib.error, brotli.error):
        return head
    return head
