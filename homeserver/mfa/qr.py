"""QR codes as inline SVG (for the otpauth:// link on the account page): no image request, no
JavaScript, and nothing the page's Content-Security-Policy blocks.

segno encodes; the drawing is ours and small, so what the page inlines is known exactly: one
`<svg>` with a `<title>`, a white square and one black path, colours as presentation
attributes (`fill`), which CSP's `style-src` does not govern, unlike `style=""` attributes
and `<style>` elements. No script, no link, no external reference, no text but the title.
"""

from __future__ import annotations

from html import escape

import segno

# The quiet zone around the code, in modules: ISO/IEC 18004 asks for 4.
BORDER = 4
# Rendered size in CSS pixels when the page's stylesheet says nothing (it may scale it: the
# SVG has a viewBox, and crisp edges at any size).
DEFAULT_SIZE = 240
# Level M at least (15 % of the code may be lost; segno raises it while the code keeps its
# size): the common choice of authenticator enrolment pages.
ERROR_LEVEL = "m"


def svg(text: str, title: str = "QR code", *, size: int = DEFAULT_SIZE, css_class: str = "qr") -> str:
    """`text` as a QR code: an inline `<svg>` element, `size` CSS pixels square.

    Each row's runs of dark modules are one rectangle (`M x y h n v 1 h -n z`), so the path
    stays a few kilobytes for an otpauth:// link.
    """
    code = segno.make(text, error=ERROR_LEVEL, micro=False)
    rows = list(code.matrix_iter(scale=1, border=BORDER))
    width = len(rows)
    runs: list[str] = []
    for y, row in enumerate(rows):
        x = 0
        cells = list(row)
        while x < width:
            if not cells[x]:
                x += 1
                continue
            start = x
            while x < width and cells[x]:
                x += 1
            runs.append(f"M{start} {y}h{x - start}v1h-{x - start}z")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {width}" width="{size}" height="{size}" '
        f'class="{escape(css_class)}" role="img" shape-rendering="crispEdges">'
        f"<title>{escape(title)}</title>"
        f'<rect width="{width}" height="{width}" fill="#fff"/>'
        f'<path fill="#000" d="{"".join(runs)}"/>'
        "</svg>"
    )
