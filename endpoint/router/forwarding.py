"""Plain HTTP routed for one client connection: its login, then each request through an
upstream the pool picks, and what became of it.

A request goes through an idle link to the picked upstream when one is kept (``Idle``:
an HTTP proxy's own connection, or a SOCKS tunnel to the same site), else a new one,
opened hedged (``Router.first_link``). The hot path (a login the connection showed
already, an idle link) runs in the protocols' callbacks with no task between them: the
link calls ``Forwarding`` (its ``Client``), which calls the connection (its
``Answering``), each declared by the room that calls it.

A proxy that says nothing once it took the request failed on the way (router/charges.py:
the proxy's failure, avoided at once, within the consumer's share of such failures),
and the request is tried through another while its method is idempotent; an idle link that
went stale is tried once more on a fresh one and blames nobody; a site that turns a
request away blames nobody either (router/verdicts.py).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Protocol

from endpoint.link.request import Request
from endpoint.link.uplink import CLOSED, UpLink, idle_key
from endpoint.router.choose import pace
from endpoint.router.login import Want, challenge
from endpoint.router.router import Router
from endpoint.router.verdicts import ALIKE, head_verdict_of, page_bytes, retry_after_s
from events.sites import BLOCKED, NONE, PACED, THROUGH

__all__ = ["IDEMPOTENT", "Answering", "Forwarding"]

IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})


class Answering(Protocol):
    """The client connection the router routes for (the connection room's
    ``ClientSide``): where the answer goes, and how a request ends."""

    closing: bool
    peer: str  # the client's address

    def write(self, data: bytes | bytearray, *, flush: bool = False) -> None: ...
    def refuse(self, status: int, why: str, extra: bytes = b"") -> None: ...
    def close(self) -> None: ...
    def answered(self, keep_alive: bool) -> None:
        """The whole answer went to the client: the next request may be read."""


class Forwarding:
    """One client connection's plain HTTP, as the router sees it: the login it showed,
    the request in flight and the link carrying it."""

    def __init__(self, router: Router, conn: Answering) -> None:
        self.router, self.conn = router, conn
        self.write = conn.write  # the link writes the answer's bytes straight through
        self.want: Want | None = None
        self.password = ""
        self.said = b""  # the Proxy-Authorization the connection logged in with
        self.login_at = 0.0  # when its login was last found good
        self.held: tuple[str, str] | None = None  # the login it is held under (revocation)
        self.current: Request | None = None
        self.link: UpLink | None = None

    # -- the login ----------------------------------------------------------------------

    def login_known(self, authorization: bytes) -> bool:
        """Whether the connection showed this login, found good within the recheck time."""
        fresh = time.monotonic() - self.login_at < self.router.login_recheck_s
        return self.want is not None and authorization == self.said and fresh

    async def log_in(self, authorization: bytes) -> bool:
        """Check ``authorization`` and make it the connection's; refuse and close (407,
        429 past the consumer's connections) when it fails."""
        router, conn = self.router, self.conn
        want, password, why = await router.door.http_login(authorization, conn.peer)
        if conn.closing:
            return False
        if want is None:
            router.outcomes.count("login_refused")
            conn.refuse(407, why, challenge(why))
            return False
        if self.want is None or want.consumer != self.want.consumer:
            router.door.leave(self.want)
            self.want = None
            if not router.door.enter(want):
                router.outcomes.count("over_limit")
                conn.refuse(429, f"{want.consumer} has its connections open already")
                return False
        if (want.consumer, password) != self.held:
            router.door.release(conn)
            router.door.hold((want.consumer, password), conn)
            self.held = (want.consumer, password)
        self.want, self.password, self.said = want, password, authorization
        self.login_at = time.monotonic()
        return True

    def hand_over(self) -> Want | None:
        """The connection becomes a tunnel, which holds its own login: the login this
        held, its slot the tunnel's from here on."""
        held, self.want = self.want, None
        self.router.door.release(self.conn)
        return held

    def ended(self) -> None:
        """The client's connection is gone: its link closed, its slot and login let go."""
        if self.link is not None:  # the client went away mid-answer, or was revoked
            self.link.client = None
            self.link.close()
            self.link = None
        self.router.door.leave(self.want)
        self.router.door.release(self.conn)
        self.want = None

    # -- one request --------------------------------------------------------------------

    def start(self, req: Request) -> None:
        """A request read whole: routed once its login is known."""
        self.current = req
        self.router.place(req)
        if self.login_known(req.authorization):
            self.route(req)
        else:
            self.router.spawn(self._login_then_route(req))

    async def _login_then_route(self, req: Request) -> None:
        if await self.log_in(req.authorization):
            self.route(req)

    def route(self, req: Request) -> None:
        """Through an idle link when the picked upstream has one; else a new one."""
        assert self.want is not None
        router = self.router
        if not req.tried and (why := router.refused_destination(req.host)):
            self.conn.refuse(403, why)
            return
        now = time.monotonic()
        if len(req.tried) >= router.attempts:
            self._no_proxy(req)
            return
        exclude = req.tried | router.charges.left_out(self.want.consumer, req.site, now)
        up = router.pool.pick(self.want, tunnel=False, now=now, exclude=exclude, site=req.site)
        if up is None:
            self._no_proxy(req)
            return
        key = idle_key(up, req.host, req.port)
        link = None if req.fresh_only else router.idle.take(key, now)
        if link is not None:
            self._send(req, link)
        else:
            router.first_link(self.want, self.password, req, up, key, partial(self._linked, req))

    def _linked(self, req: Request, link: UpLink | None) -> None:
        """A new link for ``req`` (None: none got through): the client may be gone."""
        if self.conn.closing:
            if link is not None:
                link.close()
        elif link is None:
            self._no_proxy(req)
        else:
            self._send(req, link)

    def _send(self, req: Request, link: UpLink) -> None:
        self.link = link
        link.capture = page_bytes(req.rule) if req.site else 0
        link.begin(self, req)
        self.router.outcomes.added_ms.append((time.perf_counter() - req.read_at) * 1000)

    def _no_proxy(self, req: Request) -> None:
        if req.last:  # what the last proxy got, held back as a block: the site's word
            self.conn.write(req.last, flush=True)
            self.conn.close()
            return
        self.router.outcomes.count("no_proxy")
        if req.tried:  # every one that matched was tried (a 503's two reasons, apart)
            self.router.outcomes.count("no_proxy_after_tries")
        tried = " and answers" if req.tried else ""
        self.conn.refuse(503, f"no proxy in the pool matches{tried}")

    # -- what the upstream answers (the link calls these: its Client) ---------------------

    def head_passes(self, link: UpLink, status: int, location: str) -> bool:
        """Whether an answer's head goes to the client: a site that turned the request
        away, or rate-limited it, is not the proxy's failure (a rate limit paces that
        proxy there), and an idempotent request is tried through another proxy while
        nothing of the answer went to the client."""
        req, router = self.current, self.router
        assert req is not None and self.want is not None
        site, up = req.site, link.up
        url = _url(req) if site and location and 300 <= status < 400 else b""  # redirects only
        said = head_verdict_of(router.pool, site, req.rule, status, location, url, up.key)
        if said == NONE:
            router.outcomes.first_byte(req.read_at)
            return True
        now = time.monotonic()
        if said == PACED:
            router.outcomes.count("paced")
            pace(up, site, now, retry_after_s(link.retry_after))
        else:
            router.refused(self.want, self.password, up, req, url or _url(req), status, location)
        req.tried |= {up.key}
        if req.method not in IDEMPOTENT or len(req.tried) >= router.attempts:
            router.outcomes.first_byte(req.read_at)
            return True  # the client sees the site's answer
        self.link = None
        asyncio.get_running_loop().call_soon(self._again, req)
        return False

    def page_passes(self, link: UpLink, whole: bytearray | None) -> bool:
        """Whether a held HTML answer goes to the client: not when its page reads as the
        site's block and the request may still be tried through another proxy (the
        block learned, and tried again), so the consumer sees the real page; a ``whole``
        answer is kept for the client should no other proxy be left."""
        req, router = self.current, self.router
        assert req is not None and self.want is not None
        tried = req.tried | {link.up.key}
        link.said = router.read(self.want.consumer, req, link, _url(req))
        if link.said != BLOCKED or req.method not in IDEMPOTENT or len(tried) >= router.attempts:
            return True  # the whole answer's reading learns what it says (answered)
        router.charges.turned_away(self.want.consumer, link.up, req.site, time.monotonic())
        req.tried, req.last = tried, bytes(whole) if whole is not None else b""
        self.link = None
        asyncio.get_running_loop().call_soon(self._again, req)
        return False

    def _again(self, req: Request) -> None:
        if not self.conn.closing and self.current is req:
            self.route(req)

    def answered(self, link: UpLink, reusable: bool) -> None:
        """The whole answer went to the client."""
        req, router = self.current, self.router
        assert req is not None and self.want is not None
        self.link = self.current = None
        router.outcomes.count("forwarded")
        if req.site:
            self._learn(req, link)
        router.charges.worked(self.want, self.password, link.up, req.read_at)
        if reusable:
            router.idle.give(link, time.monotonic())
        else:
            link.close()
        self.conn.answered(req.keep_alive and not link.cut_client)

    def _learn(self, req: Request, link: UpLink) -> None:
        """What a whole answer says of its site, for the picks that follow."""
        assert self.want is not None
        router, now = self.router, time.monotonic()
        said = link.said or router.read(self.want.consumer, req, link, _url(req))
        if said == THROUGH:
            router.pool.got_through(link.up, req.site)
        elif said == ALIKE:
            router.pool.got_through(link.up, req.site, alike_at=now)
        elif said == PACED:
            router.outcomes.count("paced")
            pace(link.up, req.site, now, retry_after_s(link.retry_after))
        elif said == BLOCKED:
            router.charges.turned_away(self.want.consumer, link.up, req.site, now)

    def unanswered(self, link: UpLink, why: str) -> None:
        """Nothing came back: a failure on the way (a stale idle link's, nobody's; the
        site's refusal when it is the only site that closed on the proxy lately), and
        the request tried again while that is safe."""
        req = self.current
        assert req is not None and self.want is not None
        self.link = None
        link.close()
        if self.conn.closing:
            return
        if link.reused:
            if req.method not in IDEMPOTENT:
                self._no_answer()
                return
            req.fresh_only = True
        else:
            req.tried |= {link.up.key}
            router = self.router
            closed = why == CLOSED and req.site
            if not (closed and router.site_closed(self.want, self.password, link, req, _url(req))):
                req.failures += 1
                router.charges.failed_on_the_way(
                    self.want, self.password, link.up, req.site, f"request: {why}"
                )
            if req.method not in IDEMPOTENT or req.failures >= router.attempts:
                self._no_answer()
                return
        self.route(req)

    def _no_answer(self) -> None:
        self.router.outcomes.count("no_answer")
        self.conn.refuse(502, "the proxy took the request and gave no answer")

    def broken(self, link: UpLink) -> None:
        """The answer broke off midway: what came is sent, and the client's connection
        ends (it cannot tell where the answer stopped otherwise)."""
        self.link = None
        link.close()
        self.write(b"", flush=True)
        self.conn.close()


def _url(req: Request) -> bytes:
    """The request a site's answers are compared by: its host and target (a target in
    origin form, through a SOCKS tunnel, names no host of its own), at most 512 bytes."""
    return f"{req.host}:{req.port} ".encode() + req.target[:512]
