"""The tolerance judge every generated repro script carries.

Repro scripts must run with numpy and one engine only, so they cannot import
bisect-tui; each script's constant text includes this one constant source
instead of a hand-kept copy (an empty output once crashed one copy and not the
other). It names no model data: names and tolerances come from repro.json.
"""

JUDGE_SOURCE = '''def judge(ref, out, tol):
    """(max abs error, failed criteria) of `out` against `ref` under `tol`."""
    ref = ref.astype(np.float64)
    out = out.astype(np.float64)
    err = np.abs(out - ref)
    fails = []
    atol, rtol = tol.get("atol"), tol.get("rtol")
    if atol is not None or rtol is not None:
        bound = (atol or 0.0) + (rtol or 0.0) * np.abs(ref)
        share = float(np.mean(err > bound)) if err.size else 0.0
        if share > (tol.get("max_fail_share") or 0.0):
            fails.append("%.3g%% of elements outside atol=%g + rtol=%g*|ref|" % (100 * share, atol or 0, rtol or 0))
    max_abs = float(err.max()) if err.size else 0.0
    mean_abs = float(err.mean()) if err.size else 0.0
    for key, value in (("max_abs", max_abs), ("mean_abs", mean_abs)):
        if tol.get(key) is not None and value > tol[key]:
            fails.append("%s %.3g > %g" % (key, value, tol[key]))
    if tol.get("min_cosine") is not None:
        a, b = ref.ravel(), out.ravel()
        denom = np.linalg.norm(a) * np.linalg.norm(b)
        cos = float(a @ b / denom) if denom else 1.0
        if cos < tol["min_cosine"]:
            fails.append("cosine %.6f < %g" % (cos, tol["min_cosine"]))
    if not np.isfinite(out).all() and np.isfinite(ref).all():
        fails.append("NaN/Inf in the fused output")
    return max_abs, fails
'''

# where a script's constant text takes the judge
JUDGE_SLOT = "#@judge\n"


def with_judge(script: str) -> str:
    if script.count(JUDGE_SLOT) != 1:
        raise ValueError("a repro script needs exactly one judge slot")
    return script.replace(JUDGE_SLOT, JUDGE_SOURCE + "\n")
