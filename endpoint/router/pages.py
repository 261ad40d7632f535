"""What answers to one request looked like through the proxies lately, for reading a
site without a rule by its classes (events/sites.py ``by_classes``): a block that looks
like a page is told from the page by what other proxies got, never by how many got it.

Per URL, an answer of each class, kept as what comparing reads (its status, redirect,
title and size: a few hundred bytes, never its page), and the proxies that got one of
that class; the least recently asked URLs are forgotten first, so traffic to many sites
never stops the learning of a new one. A page with a vendor's sign is a block by itself
and is not kept as a class.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from events.blockpages import block_sign
from events.sites import Answer, page_title, same_class

__all__ = ["CLASSES", "URLS", "Pages"]

URLS = 4_096  # URLs remembered, the least recently asked forgotten first
CLASSES = 4  # classes kept a URL: a fifth replaces the oldest
Key = tuple[str, int]  # a proxy's (ip, port)


@dataclass(slots=True)
class _Class:
    answer: Answer  # one answer of the class, what the others are compared with
    proxies: set[Key] = field(default_factory=set)


class Pages:
    def __init__(self) -> None:
        self._urls: OrderedDict[bytes, list[_Class]] = OrderedDict()

    def others(self, url: bytes, proxy: Key) -> list[Answer]:
        """An answer of each class ``url`` got through proxies other than ``proxy``."""
        classes = self._urls.get(url, [])
        return [c.answer for c in classes if c.proxies - {proxy}]

    def add(self, url: bytes, proxy: Key, answer: Answer) -> None:
        """``answer`` to ``url`` through ``proxy``: into its class, or as a new one (a
        proxy is in one class of a URL: its latest answer's; a vendor's block page puts
        it in none)."""
        classes = self._urls.get(url)
        if classes is None:
            classes = self._urls[url] = []
            while len(self._urls) > URLS:
                self._urls.popitem(last=False)
        else:
            self._urls.move_to_end(url)
        for c in classes:
            c.proxies.discard(proxy)
        classes[:] = [c for c in classes if c.proxies]
        if block_sign(answer.head, answer.size, answer.headers):
            return
        kind = next((c for c in classes if same_class(c.answer, answer)), None)
        if kind is None:
            kind = _Class(_compared(answer))
            classes.append(kind)
            del classes[:-CLASSES]
        kind.proxies.add(proxy)

    def got(self, url: bytes, answer: Answer) -> set[Key]:
        """The proxies whose latest answer to ``url`` was of ``answer``'s class."""
        for c in self._urls.get(url, []):
            if same_class(c.answer, answer):
                return set(c.proxies)
        return set()

    def classes(self, url: bytes) -> list[Answer]:
        """An answer of each class ``url`` got, the oldest class first."""
        return [c.answer for c in self._urls.get(url, [])]


def _compared(answer: Answer) -> Answer:
    """What a class keeps of an answer: what ``same_class`` and ``blockish`` read."""
    title = page_title(answer.head)
    head = b"<title>" + title + b"</title>" if title else b""
    return Answer(status=answer.status, location=answer.location, head=head, size=answer.size)
