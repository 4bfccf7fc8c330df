"""A headless Chromium for the HTML report's tests, through its command line only (no driver, no
extra package): one launch per page loads it, takes a screenshot and prints the page's console
on stderr (``--enable-logging=stderr``). The test adds a small probe script to a copy of the
page (the report itself has none): it counts what the page shows and logs one ``GDCHECK {json}``
line; any other console error (an uncaught exception, a resource that failed to load) is a
failure. And a stdlib PNG decoder, to tell a blank screenshot from a drawn one."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

PROBE = """<script>
window.addEventListener('error', e => console.error('GDERROR ' + e.message));
window.addEventListener('load', () => {
  const maps = [...document.querySelectorAll('svg.gd-heatmap')].map(svg => ({
    cells: svg.querySelectorAll('rect.cell').length,
    declared: +svg.dataset.cells, rows: +svg.dataset.rows, columns: +svg.dataset.columns,
    gaps: svg.querySelectorAll('rect.gd-gap').length,
    width: svg.getBoundingClientRect().width, height: svg.getBoundingClientRect().height}));
  const svgs = [...document.querySelectorAll('svg')].map(svg => ({
    cls: svg.getAttribute('class'), right: svg.getBoundingClientRect().right}));
  console.log('GDCHECK ' + JSON.stringify({maps, text: document.body.innerText,
    height: document.documentElement.scrollHeight, svgs,
    scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
    ticks: [...document.querySelectorAll('.gd-tick-label')].map(e => e.textContent)}));
});
</script>"""


def find_chromium() -> str | None:
    env = os.environ.get("GRADDOCTOR_CHROMIUM")
    if env:
        return env if os.path.exists(env) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def load(chromium: str, html_path: str, png_path: str, profile: str, width: int = 1400,
         height: int = 1400, timeout: float = 90) -> tuple[dict | None, list[str]]:
    """Open ``html_path`` (with the probe added) once: the screenshot goes to ``png_path``.
    Returns (the probe's report or None, the console lines that are not the probe's)."""
    with open(html_path, encoding="utf-8") as f:
        page = f.read()
    probed = html_path + ".probe.html"
    with open(probed, "w", encoding="utf-8") as f:
        f.write(page.replace("</body>", PROBE + "</body>", 1))
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--disable-dev-shm-usage", "--disable-extensions",
            f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr", "--v=0", f"--window-size={width},{height}",
            f"--screenshot={png_path}", "file://" + os.path.abspath(probed)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    probe, console = None, []
    for line in done.stderr.splitlines():
        if ":CONSOLE" not in line:
            continue
        match = re.search(r'"GDCHECK (.*)", source:', line)
        if match:
            probe = json.loads(match.group(1).encode().decode("unicode_escape")
                               if "\\u" in match.group(1) else match.group(1))
        else:
            console.append(line)
    return probe, console


def png_pixels(path: str, max_rows: int = 500) -> tuple[int, int, list[tuple[int, ...]]]:
    """(width, height, RGB pixels of the first ``max_rows`` rows) of a PNG: through Pillow when
    it is installed (matplotlib brings it), else a stdlib decoder of 8-bit RGB/RGBA (slow in
    pure Python, hence the rows limit)."""
    try:
        from PIL import Image
    except ImportError:
        return _png_pixels_stdlib(path, max_rows)
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        width, height = rgb.size
        data = rgb.crop((0, 0, width, min(height, max_rows))).tobytes()
        return width, height, [tuple(data[i:i + 3]) for i in range(0, len(data), 3)]


def _png_pixels_stdlib(path: str, max_rows: int) -> tuple[int, int, list[tuple[int, ...]]]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), f"unsupported PNG ({depth}-bit, type {colour})"
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompressobj().decompress(idat, (1 + width * channels) * min(height, max_rows))
    stride = width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(min(height, max_rows)):
        kind, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    pixels = [tuple(row[x:x + 3]) for row in rows for x in range(0, stride, channels)]
    return width, height, pixels
