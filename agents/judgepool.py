"""Judges as a pool: checked directly, benched when they fail, rotated, used politely.

A check through a proxy is only as good as the judge at the other end. The pool holds
every judge an agent was given (``--judge URL``, repeatable) or, without any, a built-in
list of well-known public echo services, and for each one:

- **health**: asked directly at start and every ``health_every_s``; a judge that fails
  directly, or answers 429, is **benched** with a cooldown that doubles each time
  (``cooldown_s`` up to ``max_cooldown_s``; while none answers, the agent's own outage,
  up to ``cooldown_s`` only) and comes back when a direct ask works again;
- **blame**: a check that fails while its judge does not answer directly is ``void``:
  the judge's failure, never counted against the proxy (and the judge is benched);
- **reachability**: a judge on a loopback or private address is used only for proxies on
  such addresses (a public proxy asked for ``127.0.0.1`` reaches its own loopback);
- **politeness**: our own judges are used first; a public judge we do not own gets at
  most ``budget_per_s`` requests a second from this agent (a token bucket), and checks
  rotate over the healthy ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import structlog

from agents.check import Judge, _request
from events.address import address_public, internal_name, parse_ipv4

__all__ = ["BUILTIN_JUDGES", "JudgePool", "JudgeState", "is_public_host"]

log = structlog.get_logger("ppf.judges")

# Well-known public echo services (httpbin and azenv formats), used when none is given.
BUILTIN_JUDGES = (
    "http://httpbin.org/get",
    "http://azenv.net/",
    "http://www.proxy-listen.de/azenv.php",
    "http://proxyjudge.us/azenv.php",
    "http://mojeip.net.pl/asdfa/azenv.php",
    "http://www.proxyjudge.info/azenv.php",
)


def is_public_host(host: str) -> bool:
    """False for an address the address rule refuses or an internal name; any other
    name counts as public (we do not resolve names here: the proxy does, at the other
    end)."""
    if parse_ipv4(host) is None and ":" not in host:
        return not internal_name(host)
    return address_public(host.strip("[]"))


@dataclass
class JudgeState:
    url: str
    judge: Judge | None = None  # None until a direct ask has worked
    healthy: bool = False
    latency_ms: int = 0
    failures: int = 0  # in a row, directly
    cooldown_s: float = 0.0
    benched_until: float = 0.0  # monotonic
    last_error: str = ""
    used: int = 0
    own: bool = False  # ppf's own judge: no budget
    _tokens: float = 0.0
    _refilled: float = field(default_factory=time.monotonic)
    _answered_at: float = -1e9  # monotonic time of the last direct ask that worked

    @property
    def public(self) -> bool:
        return is_public_host(urlsplit(self.url).hostname or "")

    def row(self) -> dict[str, object]:
        """What ``ppf judges`` and ``/v1/stats`` show."""
        now = time.monotonic()
        return {
            "url": self.url,
            "healthy": self.healthy,
            "format": self.judge.format if self.judge else "",
            "latency_ms": self.latency_ms,
            "failures": self.failures,
            "cooldown_s": round(max(self.benched_until - now, 0.0), 1),
            "last_error": self.last_error,
            "used": self.used,
        }


class JudgePool:
    """The judges an agent checks through. ``pick`` never blocks; ``acquire`` may wait."""

    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        tls_url: str | None = None,
        own: Sequence[str] = (),
        budget_per_s: float = 5.0,
        health_every_s: float = 60.0,
        cooldown_s: float = 30.0,
        max_cooldown_s: float = 3600.0,
        timeout_s: float = 10.0,
        agent: str = "",
        key: bytes = b"",
    ) -> None:
        chosen = list(dict.fromkeys(urls or BUILTIN_JUDGES))
        self.states = [JudgeState(u, own=u in own, _tokens=budget_per_s) for u in chosen]
        self.tls_url = tls_url
        self.budget_per_s = budget_per_s
        self.health_every_s = health_every_s
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.timeout_s = timeout_s
        # Our own judges sign for us when the world can reach them (gateway/judge.py).
        self.agent, self.key = agent, key
        self._next = 0
        self._task: asyncio.Task[None] | None = None
        self._asking: dict[str, asyncio.Future[bool]] = {}

    async def start(self, *, require: bool = True) -> JudgePool:
        """Ask every judge directly. When none answers: ValueError with ``require`` (an
        operator's typo should stop ``ppf agent`` at once), else the pool starts down
        and ``outage`` says why (a machine without internet: the agent waits)."""
        await asyncio.gather(*(self._ask(s, quiet=True) for s in self.states))
        if not self.healthy_any() and require:
            raise ValueError(f"no judge answers: {self.outage()}")
        log.info("judges_ready", judges=[s.row() for s in self.states])
        self._task = asyncio.create_task(self._watch(), name="ppf-judges")
        return self

    def healthy_any(self) -> bool:
        return any(s.healthy for s in self.states)

    def outage(self) -> str:
        """Why no judge can be used, in one line ("" while one can)."""
        if self.healthy_any():
            return ""
        return "no judge answers directly: " + "; ".join(
            f"{s.url}: {s.last_error}" for s in self.states
        )

    async def stop(self) -> None:
        """The health watch and the asks in flight (``answers`` shields them from the
        checks that wait on them, so a check gone leaves its ask running) ended, their
        connections closed."""
        tasks = [t for t in (self._task, *self._asking.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(self.health_every_s, 5.0))
            now = time.monotonic()
            due = [
                s
                for s in self.states
                if (not s.healthy and now >= s.benched_until)
                or (s.healthy and now - s._answered_at >= self.health_every_s)
            ]
            await asyncio.gather(*(self._ask(s) for s in due))

    async def _ask(self, state: JudgeState, *, quiet: bool = False) -> bool:
        """One direct ask: discovery the first time, a health check after."""
        started = time.perf_counter()
        asked = time.monotonic()  # it was alive after this, not after its answer came
        try:
            if state.judge is None:
                tls = self.tls_url if state.own else None
                signer = (self.agent, self.key) if state.own and self.key else None
                state.judge = await Judge.discover(
                    state.url, self.timeout_s, tls_url=tls, signer=signer
                )
            else:
                await _direct(state.judge, self.timeout_s)
        except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
            self._bench(state, f"{type(exc).__name__}: {exc}"[:200], quiet=quiet)
            return False
        state.latency_ms = int((time.perf_counter() - started) * 1000)
        if not state.healthy:
            log.info("judge_healthy", judge=state.url, latency_ms=state.latency_ms)
        state.healthy, state.failures, state.last_error = True, 0, ""
        state.cooldown_s = 0.0
        state._answered_at = asked
        return True

    def _bench(self, state: JudgeState, why: str, *, quiet: bool = False) -> None:
        state.failures += 1
        was_healthy, state.healthy, state.last_error = state.healthy, False, why
        # While no judge answers, the fault is most likely our own way out (an outage):
        # each is asked again within the base period, so the agent sees its network back
        # (and says so to the fleet) within it, not after a judge's long bench.
        longest = self.max_cooldown_s if self.healthy_any() else self.base_cooldown_s
        state.cooldown_s = min(max(state.cooldown_s * 2, self.base_cooldown_s), longest)
        state.benched_until = time.monotonic() + state.cooldown_s
        if was_healthy or (state.failures == 1 and not quiet):
            log.warning("judge_benched", judge=state.url, error=why, cooldown_s=state.cooldown_s)

    def pick(self, ip: str) -> Judge | None:
        """The next healthy judge that can see ``ip``'s answers and has budget, or None.

        Our own judges come first (no budget to spend, and a TLS twin that catches
        interception); the public ones are the fallback, rotated and rationed."""
        return self._pick(ip, own=True) or self._pick(ip, own=False)

    def _pick(self, ip: str, *, own: bool) -> Judge | None:
        public = is_public_host(ip)
        count = len(self.states)
        for i in range(count):
            state = self.states[(self._next + i) % count]
            if state.own != own or not state.healthy or state.judge is None:
                continue
            if state.public != public:
                continue
            # Only public judges we do not own are rationed: a loopback or private one is
            # ours or the lab's.
            if not state.own and state.public and not self._take(state):
                continue
            self._next = (self._next + i + 1) % count
            state.used += 1
            return state.judge
        return None

    async def acquire(self, ip: str, wait_s: float = 30.0) -> Judge | None:
        """``pick``, waiting for budget (at most ``wait_s``) when every judge is busy."""
        deadline = time.monotonic() + wait_s
        while True:
            judge = self.pick(ip)
            if judge is not None or not self.usable(ip) or time.monotonic() >= deadline:
                return judge
            await asyncio.sleep(0.05)

    def usable(self, ip: str) -> bool:
        """Whether some healthy judge can see ``ip`` (budget aside)."""
        public = is_public_host(ip)
        return any(s.healthy and s.public == public for s in self.states)

    def _take(self, state: JudgeState) -> bool:
        now = time.monotonic()
        state._tokens = min(
            self.budget_per_s, state._tokens + (now - state._refilled) * self.budget_per_s
        )
        state._refilled = now
        if state._tokens < 1.0:
            return False
        state._tokens -= 1.0
        return True

    async def answers(self, judge: Judge, since: float) -> bool:
        """Whether ``judge`` answered a direct ask sent after ``since`` (monotonic: when
        the failed check began), asking it now if not; a judge that does not answer is
        benched, and the checks that failed through it are void. Concurrent failures
        through one judge share one ask. An answer to an ask sent before ``since`` does
        not do: the judge may have died between sending it and the check (a health
        check answered as the judge stopped made the checks through it the proxies'
        failures)."""
        state = next((s for s in self.states if s.judge is judge), None)
        if state is None:
            return True
        for _ in range(2):  # an ask in flight from before ``since``, then one of our own
            if state._answered_at >= since:
                return True
            # A public judge we do not own is asked at most once a second, however many
            # checks fail through it (politeness, at the cost of a second's doubt).
            recent = time.monotonic() - state._answered_at < 1.0
            if state.healthy and recent and state.public and not state.own:
                return True
            if not state.healthy and state.benched_until > since:
                return False
            asking = self._asking.get(state.url)
            if asking is None:
                asking = asyncio.ensure_future(self._ask(state))
                self._asking[state.url] = asking
                asking.add_done_callback(lambda _: self._asking.pop(state.url, None))
            if not await asyncio.shield(asking):
                return False
        return state._answered_at >= since

    def rows(self) -> list[dict[str, object]]:
        return [s.row() for s in self.states]


async def _direct(judge: Judge, timeout: float) -> None:
    """Ask ``judge`` directly; raises when it does not answer as a judge (429 included)."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(judge.host, judge.port)
        try:
            echo = await _request(reader, writer, judge, judge.nonce(), True)
        finally:
            writer.close()
    if echo is None:
        raise ValueError("its answer does not echo the query")
