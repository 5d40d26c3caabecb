"""Curve colours that stay apart: plotly's qualitative palettes pooled, then ordered so that each next colour is
the one farthest (CIEDE2000, the colour difference made to match what people see) from all before it. Plain
CIELAB distance overrates saturated pairs: it puts two magentas among the first twelve."""
from __future__ import annotations

import numpy as np
import plotly.colors as pcolors

__all__ = ["ciede2000", "distinct_colours", "lab"]

# Lightness bounds in CIELAB: darker is nearly black, lighter vanishes on a white figure.
_LIGHTNESS = (30.0, 78.0)


def lab(colours: list[str]) -> np.ndarray:
    """CIELAB (D65) of ``#RRGGBB`` colours, one row each."""
    rgb = np.array([[int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)] for c in colours], dtype=np.float64)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]).T
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def ciede2000(one: np.ndarray, other: np.ndarray) -> np.ndarray:
    """CIEDE2000 colour difference of CIELAB rows (Sharma, Wu and Dalal 2005), broadcast like numpy."""
    l1, a1, b1 = np.moveaxis(np.asarray(one, dtype=np.float64), -1, 0)
    l2, a2, b2 = np.moveaxis(np.asarray(other, dtype=np.float64), -1, 0)
    c_mean = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7)))
    a1, a2 = a1 * (1 + g), a2 * (1 + g)
    c1, c2 = np.hypot(a1, b1), np.hypot(a2, b2)
    h1, h2 = np.degrees(np.arctan2(b1, a1)) % 360, np.degrees(np.arctan2(b2, a2)) % 360
    dh = np.where(c1 * c2 == 0, 0.0, ((h2 - h1 + 180) % 360) - 180)
    d_l, d_c, d_h = l2 - l1, c2 - c1, 2 * np.sqrt(c1 * c2) * np.sin(np.radians(dh / 2))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    h_mean = np.where(c1 * c2 == 0, h1 + h2,
                      np.where(np.abs(h1 - h2) <= 180, (h1 + h2) / 2,
                               np.where(h1 + h2 < 360, (h1 + h2 + 360) / 2, (h1 + h2 - 360) / 2)))
    t = (1 - 0.17 * np.cos(np.radians(h_mean - 30)) + 0.24 * np.cos(np.radians(2 * h_mean))
         + 0.32 * np.cos(np.radians(3 * h_mean + 6)) - 0.20 * np.cos(np.radians(4 * h_mean - 63)))
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / np.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    r_t = (-2 * np.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7))
           * np.sin(np.radians(60 * np.exp(-(((h_mean - 275) / 25) ** 2)))))
    return np.sqrt((d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (d_c / s_c) * (d_h / s_h))


def distinct_colours(first: str = "#1F77B4") -> tuple[str, ...]:
    """Every pooled colour once, greedily ordered by farthest-first from ``first``."""
    q = pcolors.qualitative
    pool = [c.upper() for c in (*q.D3, *q.Dark24, *q.Alphabet, *q.Plotly, *q.G10, *q.T10, *q.Bold, *q.Vivid)
            if c.startswith("#") and len(c) == 7]
    pool = list(dict.fromkeys([first.upper(), *pool]))
    points = lab(pool)
    pool = [c for c, p in zip(pool, points) if _LIGHTNESS[0] <= p[0] <= _LIGHTNESS[1]]
    points = lab(pool)
    chosen = [0]
    nearest = ciede2000(points, points[0])
    while len(chosen) < len(pool):
        pick = int(np.argmax(nearest))
        chosen.append(pick)
        nearest = np.minimum(nearest, ciede2000(points, points[pick]))
        nearest[chosen] = -1.0
    return tuple(pool[i] for i in chosen)
