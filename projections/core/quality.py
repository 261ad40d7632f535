"""The quality signals as a reader asks for them (the fold's side: reducers/quality.py):
a proxy's uptime over the last days, since when it has worked without a break, its
download speed, and whether its address is in a datacenter.

Datacenter or not is read from the AS organisation the geo data gave the address
(``ProxyRow.as_org``, in the log with the data's version) against ``HOSTING``, a list
shipped with ppf: the names of the largest hosting and cloud networks as that data
spells them, and the words hosting networks name themselves by. No package keeps such
a list for offline use, and the geo data names an AS but not its kind, so the rule is
ours, versioned by ``HOSTING_LIST`` (served beside the answer): a change of the list
reclassifies every proxy at once, with nothing looked up again, from what the log
already holds. An address the data has no AS for is neither (``""``).
"""

from __future__ import annotations

import re
from functools import cache

from reducers.quality import DAY_MS, WINDOW_DAYS
from reducers.rows import ProxyQuality

__all__ = ["HOSTING_LIST", "UPTIME_DAYS", "datacenter", "stable_since", "uptime"]

UPTIME_DAYS = WINDOW_DAYS  # uptime's window: these days of log time (UTC), today's included
HOSTING_LIST = "ppf-hosting-1"  # the rule below; a new one for every change of it

# The largest hosting and cloud networks, exactly as the GeoLite2 AS data names them.
_NAMES = frozenset(
    {
        "AMAZON-02",
        "AMAZON-AES",
        "GOOGLE-CLOUD-PLATFORM",
        "MICROSOFT-CORP-MSN-AS-BLOCK",
        "DIGITALOCEAN-ASN",
        "OVH SAS",
        "Hetzner Online GmbH",
        "Akamai Connected Cloud",
        "Linode, LLC",
        "Contabo GmbH",
        "Scaleway S.a.s.",
        "ORACLE-BMC-31898",
        "AS-CHOOPA",
        "AS-CHOOPA3",
        "M247 Europe SRL",
        "M247 Ltd",
        "IONOS SE",
        "Hostinger International Limited",
        "CLOUDFLARENET",
        "AS-COLOCROSSING",
        "G-Core Labs S.A.",
        "Kamatera, Inc.",
        "HOSTWINDS",
        "Hangzhou Alibaba Advertising Co.,Ltd.",
        "Alibaba US Technology Co., Ltd.",
        "Alibaba Cloud Singapore Private Limited",
        "Shenzhen Tencent Computer Systems Company Limited",
        "Tencent Building, Kejizhongyi Avenue",
        "OOO Network of data-centers Selectel",
        "TimeWeb Ltd.",
        "Aeza International Ltd",
    }
)
# The words hosting networks call themselves by (about 860 of the data's 69,661 names).
_WORDS = re.compile(
    r"\b(hosting|host|vps|vds|cloud|clouds|server|servers|datacenter|datacentre|"
    r"data center|data centre|data-centers|colocation|colo|dedicated|leaseweb)\b",
    re.IGNORECASE,
)


@cache
def datacenter(as_org: str) -> str:
    """ "yes" for an AS of ``HOSTING``'s, "no" for another, "" for none known."""
    if not as_org:
        return ""
    return "yes" if as_org in _NAMES or _WORDS.search(as_org) else "no"


def uptime(row: ProxyQuality | None, now: int) -> float | None:
    """The share of the known time of the last ``UPTIME_DAYS`` days (to ``now``) the
    proxy was up, 0-1; None when none of it is known."""
    if row is None or not row.known:
        return None
    first = now // DAY_MS - (UPTIME_DAYS - 1) - row.day0  # the window's first day's index
    known = sum(row.known[max(first, 0) :])
    return sum(row.up[max(first, 0) :]) / known if known else None


def stable_since(row: ProxyQuality | None) -> int:
    """Log time its unbroken run of successes began; 0 when its latest check failed."""
    return row.up_since if row is not None and row.last_ok else 0
