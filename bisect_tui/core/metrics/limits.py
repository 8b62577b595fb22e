"""How a measured figure stands against its limit: the ratio, and the digits.

Every criterion gets a *ratio*: how many times over its limit the figure is
(1.0 is the boundary, > 1 fails). The bisection ranks steps by the worst one,
so criteria in different units (dB, cosine, absolute error) share one scale.
The number formats print a measured value with enough digits never to look
equal to a limit it is not equal to.
"""

from __future__ import annotations

import math


def le_ratio(m: float, limit: float) -> float:
    """For upper bounds: measured / limit."""
    if math.isnan(m):
        return math.inf
    if limit > 0:
        return m / limit
    return 0.0 if m <= limit else math.inf


def one_minus_ratio(m: float, limit: float) -> float:
    """For cosine/top-k (best is 1): distance from 1 relative to the allowed one."""
    if math.isnan(m):
        return math.inf
    room = 1.0 - limit
    if room <= 0:
        return 0.0 if m >= limit else math.inf
    return max(0.0, (1.0 - m) / room)


def snr_ratio(m: float, limit: float) -> float:
    """Error power relative to the allowed error power: 10^((limit - snr)/10)."""
    if math.isnan(m):
        return math.inf
    x = (limit - m) / 10.0
    return math.inf if x > 300 else 10.0**x


def holds(m: float, limit: float, op: str) -> bool:
    return m <= limit if op == "<=" else m >= limit  # NaN compares False: fails


def lim(v: float) -> str:
    """Shortest scientific form: 1e-04, 1.3e-06."""
    mant, _, exp = f"{v:.6e}".partition("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{exp}"


def _shortest(m: float, limit: float, specs: tuple[str, ...]) -> str:
    """``m`` with the fewest digits that do not print equal to a different limit
    (``specs``: the formats to try, fewest digits first, made once: a judge
    words a figure of each of thousands of tensors)."""
    if not math.isfinite(m):
        return str(m)
    if m == limit:
        return format(m, specs[0])
    for spec in specs:
        s = format(m, spec)
        if float(s) != limit:
            return s
    return repr(m)


_SCI = tuple(f".{p}e" for p in range(1, 10))
_FIX = tuple(f".{p}f" for p in range(4, 13))


def sci(m: float, limit: float) -> str:
    """Scientific form: 1.2e-03."""
    return _shortest(m, limit, _SCI)


def fix(m: float, limit: float) -> str:
    """Fixed-point form with at least four decimals: 0.9990."""
    return _shortest(m, limit, _FIX)


def pct(share: float) -> str:
    value = share * 100
    return f"{value:.1f}%" if value >= 0.1 or value == 0 else f"{value:.2g}%"
