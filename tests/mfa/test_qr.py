"""The QR code of the otpauth:// link: an SVG the account page can inline under its CSP, and
one that reads back as the link (drawn to pixels, decoded by zxing-cpp)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import zxingcpp

from homeserver.mfa import qr, totp

SVG_NS = "{http://www.w3.org/2000/svg}"
RUN = re.compile(r"M(\d+) (\d+)h(\d+)v1h-\3z")


def pixels(svg: str, scale: int = 4) -> tuple[memoryview, int]:
    """The SVG's path drawn as a grey-scale bitmap (white background, black runs), `scale`
    pixels a module; a white margin of one module more than the SVG's quiet zone."""
    root = ET.fromstring(svg)
    size = int(root.get("viewBox", "").split()[2])
    path = root.find(f"{SVG_NS}path")
    assert path is not None
    d = path.get("d", "")
    runs = RUN.findall(d)
    assert "".join(m.group(0) for m in RUN.finditer(d)) == d, "the path is only runs"
    side = size * scale
    image = bytearray(b"\xff" * side * side)
    for x, y, length in runs:
        x, y, length = int(x), int(y), int(length)
        for row in range(y * scale, (y + 1) * scale):
            image[row * side + x * scale:row * side + (x + length) * scale] = b"\x00" * (length * scale)
    return memoryview(bytes(image)).cast("B", (side, side)), side


@pytest.mark.parametrize("account", ["alice", "a" * 255, "ren\u00e9"])
def test_the_svg_reads_back_as_the_link(account):
    uri = totp.provisioning_uri(totp.new_secret(), account, "matrix.example.org")
    image, _ = pixels(qr.svg(uri))
    found = zxingcpp.read_barcode(image, formats=zxingcpp.BarcodeFormat.QRCode)
    assert found is not None and found.valid
    assert found.text == uri


def test_the_svg_is_safe_to_inline_under_the_pages_csp():
    """Under `default-src 'none'; style-src 'self'; img-src 'self'` an inline style attribute
    or <style> element is blocked (the code would lose its colours), a script or an external
    reference too: the SVG has none of them, only presentation attributes."""
    svg = qr.svg(totp.provisioning_uri(totp.new_secret(), "alice", "example.org"), "QR <code> & \"link\"")
    root = ET.fromstring(svg)  # well-formed XML: it parses as HTML's foreign content alike
    assert root.tag == f"{SVG_NS}svg"
    tags = [element.tag.removeprefix(SVG_NS) for element in root.iter()]
    assert tags == ["svg", "title", "rect", "path"]
    allowed = {"viewBox", "width", "height", "class", "role", "shape-rendering", "fill", "d"}
    for element in root.iter():
        assert set(element.attrib) <= allowed, element.attrib
    assert "style" not in svg and "script" not in svg.lower() and "href" not in svg and "url(" not in svg
    assert root.find(f"{SVG_NS}title").text == "QR <code> & \"link\""  # escaped in the text
    assert root.find(f"{SVG_NS}rect").get("fill") == "#fff"
    assert root.find(f"{SVG_NS}path").get("fill") == "#000"


def test_the_svg_has_a_size_and_a_viewbox_and_stays_small():
    svg = qr.svg(totp.provisioning_uri(totp.new_secret(), "a" * 255, "example.org"), size=200, css_class="qr big")
    root = ET.fromstring(svg)
    assert (root.get("width"), root.get("height"), root.get("class")) == ("200", "200", "qr big")
    side = int(root.get("viewBox").split()[2])
    assert root.get("viewBox") == f"0 0 {side} {side}"
    assert len(svg) < 32_000  # the longest link a name can make
    assert len(qr.svg(totp.provisioning_uri(totp.new_secret(), "alice", "example.org"))) < 8_000
