"""Headless Debian Chromium for the --html page tests: load a page from a file, collect its DOM,
console messages and every network request it makes, and a screenshot.

Requests: Chromium is pointed at a proxy on a local socket, so any http(s) fetch reaches it and is
recorded (a file:// page has no other way out). Chromium's own service pings (component updates,
sign-in, network time), which it sends at startup whatever the page holds, are told apart by
their hosts and left out.
"""

from __future__ import annotations

import io
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--no-pings", "--disable-domain-reliability",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0")
BROWSER_HOSTS = re.compile(r"(^|\.)(google\.com|googleapis\.com|gstatic\.com|gvt1\.com)(:\d+)?$")
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")
_REQUEST = re.compile(r"^(?:CONNECT (\S+)|[A-Z]+ \w+://([^/\s]+)\S*) HTTP/")


def available() -> bool:
    return Path(CHROMIUM).exists()


@dataclass
class Rendered:
    dom: str
    console: list[str]
    requests: list[str]  # request lines, Chromium's own service pings left out
    screenshot: bytes  # PNG


class _Proxy:
    """Accepts connections on 127.0.0.1 and records each one's request line (then drops it)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.lines: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.lines.append(conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1"))
                except OSError as exc:
                    self.lines.append(f"? {exc}")

    def close(self) -> None:
        self.sock.close()


def page_requests(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        m = _REQUEST.match(line)
        host = (m.group(1) or m.group(2)) if m else ""
        if not BROWSER_HOSTS.search(host):
            out.append(line)
    return out


def render(path: Path, width: int = 1200, height: int = 1600) -> Rendered:
    proxy = _Proxy()
    with tempfile.TemporaryDirectory() as profile:
        shot = Path(profile) / "shot.png"
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}/user", f"--proxy-server=http://127.0.0.1:{proxy.port}",
               "--proxy-bypass-list=<-loopback>", f"--window-size={width},{height}", f"--screenshot={shot}",
               "--dump-dom", path.resolve().as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        proxy.close()
        assert done.returncode == 0, done.stderr[-2000:]
        console = [m.group(1) for m in map(_CONSOLE.search, done.stderr.splitlines()) if m]
        return Rendered(done.stdout, console, page_requests(proxy.lines), shot.read_bytes())


def inked_fraction(png: bytes) -> float:
    """The share of the screenshot's pixels that are not (near) white."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    histogram = image.histogram()
    return 1 - sum(histogram[245:]) / max(sum(histogram), 1)


# Elements and attributes through which a page would fetch something.
_FETCHING_TAGS = frozenset({"script", "img", "link", "iframe", "object", "embed", "video", "audio", "source", "image",
                            "use", "base", "frame"})
_FETCHING_ATTRS = frozenset({"src", "href", "xlink:href", "srcset", "data", "poster", "background", "action"})


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    figure: dict[str, str] | None  # the enclosing <figure>'s attributes
    text: str = ""


@dataclass
class Dom(HTMLParser):
    """Every element with its enclosing figure, and the page's external references."""

    elements: list[Element] = field(default_factory=list)
    external: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._figure: dict[str, str] | None = None
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if tag == "figure":
            self._figure = values
        element = Element(tag, values, self._figure)
        self.elements.append(element)
        self._open.append(element)
        if tag in _FETCHING_TAGS:
            self.external.append(f"<{tag}>")
        for name, value in values.items():
            if (name in _FETCHING_ATTRS and not value.startswith("#")) or re.search(r"url\((?!\s*['\"]?#)", value):
                self.external.append(f"{tag} {name}={value}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._figure = None
        while self._open:
            if self._open.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1].text += data
        if re.search(r"url\((?!\s*['\"]?#)|@import", data):
            self.external.append(f"css: {data.strip()[:60]}")

    def figures(self) -> list[Element]:
        return [e for e in self.elements if e.tag == "figure"]

    def inside(self, kind: str, **data: str) -> list[Element]:
        """Elements inside figures of data-figure ``kind`` whose other data- attributes match ``data``."""
        return [e for e in self.elements if e.figure is not None and e.figure.get("data-figure") == kind
                and all(e.figure.get(f"data-{k}") == v for k, v in data.items()) and e.tag != "figure"]


def parse(dom: str) -> Dom:
    parsed = Dom()
    parsed.feed(dom)
    return parsed
