"""The tuning report: JSON (schema in README, "The tuning report"), a text table, HTML.

Example
-------
>>> row = {"id": "softmax[target=host,arg0=8x256]", "status": "ok", "reused": False,
...        "winner": "softmax[target=host,arg0=8x256,kernel.block_size=64]",
...        "device": "x86_64 CPU", "worker": "tcp://w", "winner_median_s": 1e-5,
...        "default_median_s": 2e-5, "speedup": 2.0, "variants": []}
>>> print(format_table([row]))
softmax[target=host,arg0=8x256] on x86_64 CPU (tcp://w): winner kernel.block_size=64, 10.0 us, 2.00x over the defaults
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from typing import Any

REPORT_FORMAT = 1


def build_report(result: Any) -> dict[str, Any]:
    """``{"format", "groups": [...], "summary": {...}, "batch": {...} | None}``."""
    groups = [_public(g) for g in result.groups]
    variants = [v for g in groups for v in g["variants"]]
    summary = {
        "groups": len(groups),
        "tuned": sum(g["status"] == "ok" and not g["reused"] for g in groups),
        "reused": sum(bool(g["reused"]) for g in groups),
        "failed": sum(g["status"] != "ok" for g in groups),
        "variants": len(variants),
        "timed": sum("median_s" in v for v in variants),
        "wrong": sum(v["status"] == "wrong" for v in variants),
        "variant_failures": sum(v["status"] == "failed" for v in variants),
        "wall_s": round(result.wall_s, 3),
    }
    batch = result.batch.report() if result.batch is not None else None
    return {"format": REPORT_FORMAT, "groups": groups, "summary": summary, "batch": batch}


def _public(g: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in g.items() if not k.startswith("_")}


def _us(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-2 else f"{s * 1e3:.2f} ms"


def _options_text(vid: str, gid: str) -> str:
    """The options part of a variant id (what differs from its group's id)."""
    inner, group_inner = vid[vid.index("[") + 1:-1], gid[gid.index("[") + 1:-1]
    rest = inner[len(group_inner):].lstrip(",") if inner.startswith(group_inner) else inner
    return rest or "the defaults"


def format_table(groups: Sequence[dict[str, Any]], detail: bool = False) -> str:
    """One line per group (the winner, its median, the speedup); with ``detail`` every
    variant's median, spread and check under it."""
    lines = []
    for g in groups:
        where = f"{g.get('device')} ({g.get('worker')})" if g.get("device") else "-"
        if g["status"] != "ok":
            lines.append(f"{g['id']}: no winner: {g.get('message', 'failed')}")
        else:
            gain = f", {g['speedup']:.2f}x over the defaults" if g.get("speedup") else ""
            reused = " (stored measurement)" if g.get("reused") else ""
            lines.append(f"{g['id']} on {where}: winner {_options_text(g['winner'], g['id'])}, "
                         f"{_us(g['winner_median_s'])}{gain}{reused}")
        if detail:
            for v in sorted(g["variants"], key=lambda v: v.get("median_s") or float("inf")):
                mark = "*" if v["id"] == g.get("winner") else " "
                spread = f"spread {v['spread'] * 100:.0f}%" if v.get("spread") is not None \
                    else ""
                lines.append(f"  {mark} {_options_text(v['id'], g['id']):<40} "
                             f"{_us(v.get('median_s')):>10} {spread:>12}  {v['status']}"
                             f" (check: {v.get('check')})")
    return "\n".join(lines)


def problem_lines(groups: Sequence[dict[str, Any]]) -> list[str]:
    """``FAILED id: …`` / ``WRONG id: …`` for every variant that failed or was wrong."""
    out = []
    for g in groups:
        for v in g["variants"]:
            if v["status"] == "wrong":
                why = v.get("check_message", "differs from the reference")
                out.append(f"WRONG {v['id']}: {why}")
            elif v["status"] == "failed":
                f = v.get("failure") or {}
                out.append(f"FAILED {v['id']}: {f.get('stage') or f.get('pipeline') or ''}: "
                           f"{f.get('message', '')}")
    return out


def write_html(path: str | os.PathLike[str], report: dict[str, Any]) -> str:
    """A self-contained HTML page: per group, every variant's median as a bar (min–max
    as whiskers in the text), the winner marked, wrong and failed variants named."""
    from accy.files import write_atomic

    parts = ["<!doctype html><meta charset=utf-8><title>accy tune</title><style>",
             "body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}",
             "td,th{padding:2px 8px;text-align:left}td.n{text-align:right}",
             ".bar{background:#4c78a8;height:10px}.win{font-weight:bold}",
             ".wrong{color:#b00}.failed{color:#888}</style><h1>accy tune</h1>"]
    s = report["summary"]
    parts.append(f"<p>{s['groups']} groups: {s['tuned']} tuned, {s['reused']} from the "
                 f"database, {s['failed']} without a winner; {s['wrong']} wrong and "
                 f"{s['variant_failures']} failed variants; {s['wall_s']} s</p>")
    for g in report["groups"]:
        e = html.escape
        parts.append(f"<h2>{e(g['id'])}</h2><p>{e(str(g.get('device')))} on "
                     f"{e(str(g.get('worker')))}; ")
        if g["status"] == "ok":
            gain = f"{g['speedup']:.2f}x over the defaults" if g.get("speedup") else ""
            parts.append(f"winner <b>{e(_options_text(g['winner'], g['id']))}</b> "
                         f"{_us(g['winner_median_s'])} {gain}"
                         + (" (stored measurement)" if g.get("reused") else "") + "</p>")
        else:
            parts.append(f"no winner: {e(str(g.get('message')))}</p>")
        top = max((v.get("max_s") or 0 for v in g["variants"]), default=0) or 1
        parts.append("<table><tr><th>options</th><th>median</th><th>min</th><th>max</th>"
                     "<th></th><th>check</th></tr>")
        for v in sorted(g["variants"], key=lambda v: v.get("median_s") or float("inf")):
            cls = "win" if v["id"] == g.get("winner") else v["status"]
            width = int(300 * (v.get("median_s") or 0) / top)
            parts.append(f"<tr class={cls}><td>{e(_options_text(v['id'], g['id']))}</td>"
                         f"<td class=n>{_us(v.get('median_s'))}</td>"
                         f"<td class=n>{_us(v.get('min_s'))}</td>"
                         f"<td class=n>{_us(v.get('max_s'))}</td>"
                         f"<td><div class=bar style='width:{width}px'></div></td>"
                         f"<td>{e(str(v.get('check')))} {e(v['status'])}</td></tr>")
        parts.append("</table>")
    write_atomic(path, "".join(parts))
    return os.fspath(path)
