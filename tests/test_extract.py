"""The extractor: real published lists with known answers, and every format by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import extract as extract_module
from agents.extract import Candidate, extract, native_scanner

FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "sources"


def _manifest() -> list[tuple[str, str | None, str]]:
    path = FIXTURES / "MANIFEST.tsv"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, hint, expected, _ = line.split("\t")
        rows.append((name, None if hint == "-" else hint, expected))
    return rows


NO_SCANNER = (
    "agents/_scan.c was not built: install a C compiler (apt-get install gcc) and reinstall"
)


@pytest.fixture(params=["native", "regex"])
def scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both dense-list paths: the C scanner and the regex it must equal."""
    if request.param == "native" and not native_scanner():
        pytest.skip(NO_SCANNER)
    if request.param == "regex":
        monkeypatch.setattr(extract_module, "_c_scan", None)
    return str(request.param)


@pytest.mark.skipif(not FIXTURES.exists(), reason="../shared/fixtures/sources is absent")
@pytest.mark.parametrize(("name", "hint", "expected"), _manifest(), ids=lambda x: str(x))
def test_real_lists_precision_and_recall(
    name: str, hint: str | None, expected: str, scanner: str
) -> None:
    """Precision and recall 1.0 on every published list (the shared fixtures)."""
    got = {str(c) for c in extract((FIXTURES / name).read_bytes(), hint)}
    want = set((FIXTURES / expected).read_text().split())
    hits = len(got & want)
    precision, recall = hits / max(len(got), 1), hits / len(want)
    assert precision == recall == 1.0, (precision, recall, sorted(got ^ want)[:5])


OWN = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("name", ["div_grid", "base64_script", "separated"])
def test_own_html_pages_precision_and_recall(name: str, scanner: str) -> None:
    """A div/span grid, base64-written addresses, and addresses whose ports stand
    elements away (separators, icons, cells and spans of other numbers between):
    exactly the listed proxies."""
    got = [str(c) for c in extract((OWN / f"{name}.html").read_bytes())]
    assert sorted(got) == sorted((OWN / f"{name}.expected").read_text().split())


def _strs(text: str, hint: str | None = None, lab: bool = False) -> list[str]:
    return [str(c) for c in extract(text, hint, lab=lab)]


def test_plain_schemes_and_hints() -> None:
    """Plain lines yield candidates; schemes and hints set the protocol."""
    text = "8.8.8.8:3128\nsocks5://1.1.1.1:1080\nHTTPS://9.9.9.9:443\n"
    assert _strs(text) == ["8.8.8.8:3128", "socks5://1.1.1.1:1080", "https://9.9.9.9:443"]
    assert _strs(text, "socks4")[0] == "socks4://8.8.8.8:3128"


def test_columns_csv_and_markdown() -> None:
    """Address and port in separate CSV or markdown columns are joined."""
    text = (
        "ip port type\n"
        "8.8.8.8 8080 socks4\n"
        "8.8.4.4,3128,http\n"
        "| 1.1.1.1 | 1080 | SOCKS5 | elite |\n"
        "9.9.9.9\t80\n"
    )
    assert _strs(text) == [
        "socks4://8.8.8.8:8080",
        "http://8.8.4.4:3128",
        "socks5://1.1.1.1:1080",
        "9.9.9.9:80",
    ]


def test_html_tables_take_neighbouring_cells() -> None:
    """HTML tables join an address cell with the port cell beside it."""
    html = (
        "<table><tr><th>IP</th><th>Port</th><th>Type</th></tr>"
        "<tr><td>8.8.8.8</td><td>8080</td><td>HTTPS</td></tr>"
        '<tr><td><a href="#">1.1.1.1</a></td><td> 1080 </td><td>socks5</td></tr>'
        "<tr><td>1.0.0.1</td><td>Cloudflare</td><td>53</td></tr></table>"
    )
    assert _strs(html)[:2] == ["https://8.8.8.8:8080", "socks5://1.1.1.1:1080"]
    assert not any("1.0.0.1" in s for s in _strs(html))


def test_json_any_nesting_and_proxy_strings() -> None:
    """JSON lists of objects or proxy strings are read at any nesting."""
    text = (
        '{"data": {"list": [{"ip": "8.8.8.8", "port": "8080", "protocols": ["socks4", "socks5"]},'
        ' {"Host": "1.1.1.1", "Port": 3128, "exit_ip": "9.9.9.9", "asn": 15169}]},'
        ' "extra": [{"proxy": "http://8.8.4.4:80"}, {"proxy": "9.9.9.10:8118"}]}'
    )
    assert _strs(text, "http") == [
        "socks4://8.8.8.8:8080",
        "socks5://8.8.8.8:8080",
        "http://1.1.1.1:3128",
        "http://8.8.4.4:80",
        "http://9.9.9.10:8118",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "updated 12:30:45 on 2026-11-29",
        "version 1.2.3.4.5:80",
        "build 10.0.19041.1:443 (not an address: five parts)",
        "private 10.0.0.1:8080 and 192.168.1.1:3128 and 127.0.0.1:80",
        "documentation 203.0.113.7:8080 multicast 224.0.0.1:80",
        "ports 8.8.8.8:0 8.8.8.8:65536 8.8.8.8:99999",
        "not octets 999.1.1.1:80 256.1.1.1:80",
        "ftp://8.8.8.8:21/file",
        "date 2023.11.29.10:30",
        "BTC bc1q0hxnu4gmn5ru8j7g29tv2dq2ng5g0zhanl6t4t",
    ],
)
def test_never_a_proxy(text: str) -> None:
    """Reserved, private and malformed addresses are never candidates."""
    assert extract(text) == []


def test_lab_mode_admits_loopback_and_private() -> None:
    """Lab mode admits loopback and private addresses, and only lab mode."""
    assert _strs("127.0.0.1:3128 10.1.2.3:1080", lab=True) == ["127.0.0.1:3128", "10.1.2.3:1080"]


def test_duplicates_collapse_and_confidence_says_why() -> None:
    """A candidate listed twice is one; confidence says how its protocol was known."""
    got = extract("8.8.8.8:80\n8.8.8.8:80\nsocks5://8.8.8.8:80\n8.8.4.4 80\n")
    assert got == [
        Candidate("8.8.8.8", 80, None, 0.8),
        Candidate("8.8.8.8", 80, "socks5", 1.0),
        Candidate("8.8.4.4", 80, None, 0.6),
    ]


def test_ppf_extract_command(ppf_bin: str) -> None:
    """`ppf extract -` reads stdin; --json gives objects; the hint fills the protocol."""
    import json
    import subprocess

    text = b"8.8.8.8:3128\nsocks5://1.1.1.1:1080\n10.0.0.1:80\n"
    plain = subprocess.run(
        [ppf_bin, "extract", "-", "--hint", "http"],
        input=text,
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert plain.stdout.decode().split() == ["http://8.8.8.8:3128", "socks5://1.1.1.1:1080"]
    as_json = subprocess.run(
        [ppf_bin, "extract", "-", "--json"], input=text, capture_output=True, timeout=60, check=True
    )
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert rows[0] == {"ip": "8.8.8.8", "port": 3128, "proto": None, "confidence": 0.8}


# Pieces that sit at the edges of the scanner's rules: octets and ports at and past
# their limits, leading zeros, every separator, schemes known and unknown, reserved
# prefixes, word characters and dots glued on either side, bytes that are not ASCII.
# Both sides of every edge of the reserved ranges the scanner knows by number.
_EDGES = [
    *["0.1.1.1", "1.1.1.1", "9.1.1.1", "10.1.1.1", "11.1.1.1", "126.1.1.1", "127.1.1.1"],
    *["128.1.1.1", "100.63.1.1", "100.64.1.1", "100.127.1.1", "100.128.1.1", "169.253.1.1"],
    *["169.254.1.1", "169.255.1.1", "172.15.9.9", "172.16.9.9", "172.31.9.9", "172.32.9.9"],
    *["192.0.0.1", "192.0.1.1", "192.0.2.1", "192.0.3.1", "192.1.0.1", "192.88.98.1"],
    *["192.88.99.1", "192.88.100.1", "192.167.1.1", "192.168.1.1", "192.169.1.1"],
    *["198.17.1.1", "198.18.1.1", "198.19.1.1", "198.20.1.1", "198.51.99.1", "198.51.100.1"],
    *["198.51.101.1", "203.0.112.1", "203.0.113.1", "203.0.114.1", "203.1.113.1", "223.1.1.1"],
    *["224.1.1.1", "239.1.1.1", "255.255.255.255"],
]
_PIECES = [
    *[f"{ip}:8080" for ip in _EDGES],
    *"0123456789",
    *[".", ":", " ", "\t", ",", ";", "|", "\n", "_", "a", "Z", "/", "-", "@"],
    *["25", "255", "256", "249", "00", "01", "65535", "65536", "99999", "123456"],
    *["8.8.8.8", "1.2.3.4:80", "203.0.113.9", "192.0.2.1", "192.0.20.1", "100.64.1.1"],
    *["100.128.1.1", "172.16.0.1", "172.32.0.1", "198.18.1.1", "198.51.100.1", "224.1.1.1"],
    *["10.", "127.", "169.254.", "192.168.", "192.88.99.", "0.", "223."],
    *["http://", "HTTPS://", "socks4a://", "Socks5h://", "socks://", "ftp://", "x1://", "://"],
    *["\xc3\xa9", "\xff"],
]


@pytest.mark.skipif(not native_scanner(), reason=NO_SCANNER)
@settings(max_examples=600, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(_PIECES), max_size=60),
    hint=st.sampled_from([None, "http", "https", "socks4", "socks5"]),
)
def test_native_scanner_equals_the_regex(pieces: list[str], hint: str | None) -> None:
    """agents/_scan.c is the _FAST regex, match for match, dedup and confidence included."""
    data = "".join(pieces).encode("latin-1")
    codes = extract_module._CODES
    native = extract_module._c_scan(
        data, codes.index(hint), Candidate, codes, extract_module._CONFIDENCES
    )
    regex = extract_module._first_of_each(extract_module._fast(data, hint))
    assert native == regex


@pytest.mark.skipif(not native_scanner(), reason=NO_SCANNER)
def test_native_scanner_on_a_dense_list_equals_the_regex() -> None:
    """A million-candidate list (the benchmark's shape) through both paths: identical."""
    from ops.bench.extract import dense_list

    data = dense_list(8, seed=7) + "".join(f"{ip}:80\n" for ip in _EDGES).encode()
    codes = extract_module._CODES
    native = extract_module._c_scan(data, 0, Candidate, codes, extract_module._CONFIDENCES)
    assert native == extract_module._first_of_each(extract_module._fast(data, None))
    assert len(native) > 300_000


def _ip(i: int) -> str:
    return f"8.8.{i // 250}.{i % 250 + 1}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "page",
    [
        # HTML lets </tr> and </td> be left out; a lazy row pattern rescanned the page
        # from every row (13 s for 40 KB before; these are 50 times larger).
        "<table>" + "".join(f"<tr><td>{_ip(i)}</td><td>80" for i in range(50_000)),
        "<table><tr>" + "".join(f"<td>{_ip(i)}<td>80" for i in range(50_000)),
        "<td>" + "<a" * 1_000_000 + " socks5 8.8.8.8:80",
        "socks5 " + "-a" * 1_000_000 + " 8.8.8.8:80",
        "socks5 " + "-a" * 100_000 + "@ 8.8.8.8:80",
    ],
    ids=["rows-unclosed", "cells-unclosed", "lt-without-gt", "punctuated-run", "with-at"],
)
def test_hostile_pages_cost_time_in_proportion_to_their_length(page: str) -> None:
    """A hang here is a worker stopped by one page: each of these must finish (the
    timeout is the guard; how fast is `ppf bench extract`'s to say) and be right."""
    got = extract(page.encode())
    if page.startswith("<table>") or page.startswith("<table><tr>"):
        assert len(got) == 50_000 and got[0] == Candidate("8.8.0.1", 80, None, 0.8)
    else:
        assert [str(c) for c in got] == ["socks5://8.8.8.8:80"]


@pytest.mark.parametrize("depth", [100, 990, 100_000])
def test_json_nested_past_the_stack_is_read_as_text_not_a_crash(depth: int) -> None:
    """JSON nested past the stack is read as text, never a crash."""
    page = "[" * depth + '{"ip": "8.8.8.8", "port": 80, "note": "1.1.1.1:8080"}' + "]" * depth
    got = {str(c) for c in extract(page.encode())}
    assert got in ({"8.8.8.8:80"}, {"1.1.1.1:8080"})  # the object, or the page as text
    if depth == 100:
        assert got == {"8.8.8.8:80"}
