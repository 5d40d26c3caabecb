"""WCAG 2 contrast of what a page shows, from the computed styles: every visible text (HTML and Plotly's SVG
text) against the background it is drawn on, composited up the ancestors. Used by the dark-mode test."""
from __future__ import annotations

from typing import Any

# Runs in the page: returns [text, colour, background, ratio, large, selector] for each visible text that fails.
CONTRAST_SCAN = r"""(minimum) => {
  const parse = (value) => {
    const m = value && value.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => {
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  };
  const luminance = (c) => {
    const [r, g, b] = c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => { const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const svgBackground = (el) => {
    const svg = el.ownerSVGElement || el.closest('svg');
    const plot = el.closest('.js-plotly-plot');
    if (plot) {
      const bg = plot.querySelector('.main-svg');
      const c = bg && parse(getComputedStyle(bg).backgroundColor);
      if (c && c[3] > 0) return c;
    }
    return null;
  };
  const background = (el) => {
    const layers = [];
    for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
      const style = getComputedStyle(node);
      const c = parse(style.backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let result = [255, 255, 255, 1];
    if (!layers.length || layers[layers.length - 1][3] < 1) {
      const root = parse(getComputedStyle(document.documentElement).backgroundColor);
      const body = parse(getComputedStyle(document.body).backgroundColor);
      result = (body && body[3] > 0) ? over(body, root && root[3] > 0 ? root : result) : (root && root[3] > 0 ? root : result);
    }
    for (let i = layers.length - 1; i >= 0; i--) result = over(layers[i], result);
    return result;
  };
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) return false;
    for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
      const s = getComputedStyle(node);
      if (s.visibility === 'hidden' || s.display === 'none' || Number(s.opacity) === 0) return false;
    }
    return true;
  };
  const failures = [];
  const seen = new Set();
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const text = t.textContent.trim();
    const el = t.parentElement;
    if (!text || !el || seen.has(el) || !visible(el)) continue;
    if (el.closest('script,style,noscript,option,[aria-hidden="true"]')) continue;
    seen.add(el);
    const style = getComputedStyle(el);
    const inSvg = !!el.closest('svg');
    let colour = parse(inSvg ? style.fill : style.color);
    if (!colour) continue;
    colour = colour.slice();
    colour[3] *= inSvg ? Number(style.fillOpacity || 1) : 1;
    const bg = inSvg ? (svgBackground(el) || background(el.closest('svg').parentElement)) : background(el);
    const fg = over(colour, bg);
    const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
    const large = size >= 24 || (bold && size >= 18.66);
    const value = ratio(fg, bg);
    if (value < (large ? 3 : minimum)) {
      failures.push([text.slice(0, 60), style.color + ' / ' + style.fill, 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')',
                     Math.round(value * 100) / 100, large, el.tagName + '.' + (el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className)]);
    }
  }
  return failures;
}"""


def low_contrast(page: Any, minimum: float = 4.5) -> list[list[Any]]:
    """The visible texts of ``page`` whose contrast with their background is below WCAG AA."""
    return page.evaluate(CONTRAST_SCAN, minimum)
