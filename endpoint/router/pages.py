"""What answers to one request looked like through the proxies lately, for reading a
site without a rule by its classes (events/sites.py ``by_classes``): a block that looks
like a page is told from the page by what other proxies got, never by how many got it.

Per URL, an answer of each class, kept as what comparing reads (its status, redirect,
title and size: a few hundred bytes, never its page), and the proxies that got one of
that class; the least recently asked URLs are forgotten first, so traffic to many sites
never stops the learning of a new one. A refusal (a 403, a closed connection) is a
class too: a page beside it is what the refused proxies did not get. A block page by
its signs (a vendor's, or a short page that calls itself a block: events/blockpages.py)
is such a refusal whatever its status, kept as the one its head would have been (not as
what comparing reads of it, which would lose the signs and compare it as a page).

And where a site's redirects sent its visitors lately: a client that follows a
redirect to an interstitial asks the same page of it whatever its exit, so answers
there tell no class from another (``sent_to``). And the sites that told a page from its
block lately (``splits``), with what their blocks looked like: there, answers alike to a
URL may be the block alike (most exits may be turned away), so only a page told from a
block is ``through``, and an answer of a block's class is the block on any URL of the
site (``looks_blocked``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from events.sites import Answer, compared, path_of, redirect_target, same_class, tells

__all__ = ["CLASSES", "REFUSED", "URLS", "Pages"]

URLS = 4_096  # URLs remembered, the least recently asked forgotten first
CLASSES = 4  # classes kept a URL: a fifth replaces the oldest
Key = tuple[str, int]  # a proxy's (ip, port)
# What a block page by its signs is kept as: a refusal, as a 403 told by its head is
# (endpoint/router/router.py ``refused``), so the page beside it on the same URL is the
# site's own, and a site that answers its listed exits an "Access denied" page teaches
# which exits it lets in, even when each of its URLs is asked once.
REFUSED = Answer(status=403)


@dataclass(slots=True)
class _Class:
    answer: Answer  # one answer of the class, what the others are compared with
    proxies: set[Key] = field(default_factory=set)


class Pages:
    def __init__(self) -> None:
        self._urls: OrderedDict[bytes, list[_Class]] = OrderedDict()
        self._targets: OrderedDict[tuple[str, str], None] = OrderedDict()  # (site, path)
        # Sites that told a page from its block, most recent last: the blocks' classes.
        self._splits: OrderedDict[str, list[Answer]] = OrderedDict()

    def sends_to(self, site: str, location: str) -> None:
        """``site`` redirected a request to ``location``."""
        target = (site, path_of(location))
        self._targets[target] = None
        self._targets.move_to_end(target)
        while len(self._targets) > URLS:
            self._targets.popitem(last=False)

    def sent_to(self, site: str, url: bytes) -> bool:
        """Whether ``url`` (host, port and target) is where ``site`` redirected lately."""
        if not self._targets:
            return False
        target = url.partition(b" ")[2].decode("latin-1")
        return (site, path_of(target)) in self._targets

    def others(self, url: bytes, proxy: Key) -> list[Answer]:
        """An answer of each class ``url`` got through proxies other than ``proxy``."""
        classes = self._urls.get(url, [])
        # A class is never empty (``add``): one of others has a second member or is not
        # ``proxy``'s, asked without copying its set (thousands on a busy URL).
        return [c.answer for c in classes if len(c.proxies) > 1 or proxy not in c.proxies]

    def add(self, url: bytes, proxy: Key, answer: Answer) -> None:
        """``answer`` to ``url`` through ``proxy``: into its class, or as a new one (a
        proxy is in one class of a URL: its latest answer's; a block page by its signs,
        the refusal's, ``REFUSED``)."""
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
        if answer.sign:
            answer = REFUSED
        kind = next((c for c in classes if same_class(c.answer, answer)), None)
        if kind is None:
            kind = _Class(compared(answer))
            classes.append(kind)
            del classes[:-CLASSES]
        kind.proxies.add(proxy)

    def told(self, site: str, url: bytes, answer: Answer) -> set[Key]:
        """The proxies whose latest answer to ``url`` was of a class that looks like the
        block beside ``answer`` (events/sites.py ``blockish``), in one walk; those
        classes are kept as what ``site``'s block looks like (``looks_blocked``). At the
        site's first split, also those whose latest answer to another URL of the same
        host was of such a class: answers alike there were read as the page, and gave
        those proxies a standing their block does not earn."""
        told: set[Key] = set()
        first = site not in self._splits
        for c in self._urls.get(url, []):
            if tells(answer, (c.answer,)):
                told |= c.proxies
                self._split(site, c.answer)
        if told and first:
            told |= self._of_blocks(site, url)
        return told

    def told_blocked(self, site: str, url: bytes, answer: Answer) -> set[Key]:
        """``answer`` to ``url`` read as the block beside a page of another class there
        (a page far longer, or otherwise titled, that ``tells`` it): the site told a page
        from its block as much as when the page comes second (``told``), and its class is
        kept as what the site's block looks like. At the site's first split, the proxies
        whose latest answer to another URL of the host was of that class (their standing
        read from answers alike); none else: the caller turns this answer's proxy away.
        A block page by its signs is a refusal's class (``add``), never a split."""
        if answer.sign or not any(tells(c.answer, (answer,)) for c in self._urls.get(url, [])):
            return set()
        first = site not in self._splits
        self._split(site, compared(answer))
        return self._of_blocks(site, url) if first else set()

    def _of_blocks(self, site: str, url: bytes) -> set[Key]:
        """The proxies whose latest answer to a URL of ``url``'s host and port was of a
        class told as ``site``'s block (``looks_blocked``): one walk of the URLs, once a
        site (at its first split)."""
        host = url.partition(b" ")[0] + b" "
        found: set[Key] = set()
        for other, classes in self._urls.items():
            if other.startswith(host):
                for c in classes:
                    if self.looks_blocked(site, c.answer):
                        found |= c.proxies
        return found

    def _split(self, site: str, block: Answer) -> None:
        looks = self._splits.pop(site, None) or []
        self._splits[site] = looks  # put back last: the most recent
        if not any(same_class(b, block) for b in looks):
            looks.append(block)
            del looks[:-CLASSES]
        while len(self._splits) > URLS:
            self._splits.popitem(last=False)

    def splits(self, site: str) -> bool:
        """Whether ``site`` told a page from its block lately: answers alike there may be
        the block alike, and teach nothing."""
        return site in self._splits

    def redirects_to_block(self, site: str, answer: Answer) -> bool:
        """Whether a redirect (``answer``, its head alone) goes where ``site``'s block of
        a redirect's class, told on some URL of it lately, went: a redirect's head is
        read before its body, whose size ``looks_blocked`` would compare too."""
        target = redirect_target(answer)
        return bool(target) and any(
            redirect_target(b) == target for b in self._splits.get(site, ())
        )

    def looks_blocked(self, site: str, answer: Answer) -> bool:
        """Whether ``answer`` is of a class told as ``site``'s block on some URL of it
        lately: a captcha or an interstitial is the same page whatever was asked."""
        return any(same_class(b, answer) for b in self._splits.get(site, ()))

    def got(self, url: bytes, answer: Answer) -> set[Key]:
        """The proxies whose latest answer to ``url`` was of ``answer``'s class."""
        for c in self._urls.get(url, []):
            if same_class(c.answer, answer):
                return set(c.proxies)
        return set()

    def classes(self, url: bytes) -> list[Answer]:
        """An answer of each class ``url`` got, the oldest class first."""
        return [c.answer for c in self._urls.get(url, [])]
