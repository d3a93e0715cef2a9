"""Comparison tables of run records: plain text, markdown, JSON and a static HTML dashboard."""
from __future__ import annotations

import html
import json

COLUMNS = [  # (header, getter, format)
    ("job", lambda r: r.get("job", {}).get("name", ""), "{}"),
    ("strategy", lambda r: r.get("strategy"), "{}"),
    ("world", lambda r: r.get("world_size"), "{}"),
    ("batch", lambda r: r.get("global_batch_size"), "{}"),
    ("micro x acc", lambda r: f"{r.get('per_device_batch_size')}x{r.get('accumulate_grad_batches')}", "{}"),
    ("lr", lambda r: r.get("lr"), "{:.3g}"),
    ("samples/s", lambda r: r.get("throughput", {}).get("samples_per_s"), "{:.1f}"),
    ("tokens/s", lambda r: r.get("throughput", {}).get("tokens_per_s"), "{:.0f}"),
    ("step ms (med)", lambda r: _ms(r.get("step_time_s", {}).get("median")), "{:.1f}"),  # "*": short_run
    ("step ms (p90)", lambda r: _ms(r.get("step_time_s", {}).get("p90")), "{:.1f}"),
    ("peak RSS MiB", lambda r: _mib(max(r.get("memory", {}).get("peak_rss_bytes_per_rank") or [0]) or None), "{:.0f}"),
    ("state KiB/rank", lambda r: _kib(max(r.get("memory", {}).get("model_state_bytes_per_rank") or [0]) or None), "{:.0f}"),
    ("loss first", lambda r: r.get("loss", {}).get("first"), "{:.4f}"),
    ("loss final", lambda r: r.get("loss", {}).get("final"), "{:.4f}"),
    ("MFU %", lambda r: 100 * r["mfu"]["value"] if r.get("mfu") else None, "{:.1f}"),
    ("comm %", lambda r: 100 * r["breakdown"]["comm_fraction"] if r.get("breakdown") else None, "{:.0f}"),
    ("efficiency", lambda r: r.get("scaling_efficiency"), "{:.2f}"),
    ("status", lambda r: r.get("status") if r.get("status") == "completed" else f"{r.get('status')}: {str(r.get('error', ''))[:60]}", "{}"),
]


def _ms(s):
    return None if s is None else s * 1e3


def _mib(b):
    return None if b is None else b / 2**20


def _kib(b):
    return None if b is None else b / 2**10


SHORT_MARK = "*"
SHORT_NOTE = f"{SHORT_MARK} fewer than 5 measured steps: not steady-state figures (raise trainer.max_steps)"


def _cells(rec: dict, columns) -> list[str]:
    out = []
    for head, get, fmt in columns:
        v = get(rec)
        cell = "-" if v is None or v == "" else fmt.format(v)
        if head == "step ms (med)" and rec.get("short_run") and cell != "-":
            cell += SHORT_MARK
        out.append(cell)
    return out


def _columns(records: list[dict]):
    # Drop columns that are empty for every run (e.g. efficiency outside a sweep).
    return [c for c in COLUMNS if any(c[1](r) not in (None, "", []) for r in records)]


def sort_key(r: dict):
    return (str(r.get("strategy")), r.get("global_batch_size") or 0, r.get("world_size") or 0,
            str(r.get("job", {}).get("name", "")))


def render(records: list[dict], fmt: str = "table") -> str:
    records = sorted(records, key=sort_key)
    if fmt == "json":
        return json.dumps(records, indent=2, default=str)
    cols = _columns(records)
    heads = [c[0] for c in cols]
    rows = [_cells(r, cols) for r in records]
    note = [SHORT_NOTE] if any(r.get("short_run") for r in records) else []
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows] + (["", *note] if note else []))
    if fmt == "html":
        return _html(heads, rows, records, note)
    if fmt != "table":
        raise ValueError(f"format {fmt!r} is not known: choose table, markdown, json or html")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(heads), line(["-" * w for w in widths]), *map(line, rows), *note])


def _html(heads: list[str], rows: list[list[str]], records: list[dict], note: list[str]) -> str:
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    curves = json.dumps([{"name": f"{r.get('strategy')} x{r.get('world_size')} b{r.get('global_batch_size')}",
                          "curve": r.get("loss", {}).get("curve", [])} for r in records])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ScaleLab comparison</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#eee}}</style></head>
<body><h1>ScaleLab comparison</h1><table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in heads)}</tr>{body}</table>
{''.join(f'<p>{html.escape(n)}</p>' for n in note)}
<h2>Loss curves</h2><svg id="plot" width="720" height="360"></svg>
<script>const runs={curves};const svg=document.getElementById('plot');
const all=runs.flatMap(r=>r.curve);if(all.length){{
const xs=all.map(p=>p[0]),ys=all.map(p=>p[1]);const x0=Math.min(...xs),x1=Math.max(...xs),y0=Math.min(...ys),y1=Math.max(...ys);
const X=x=>40+(x-x0)/(x1-x0||1)*660,Y=y=>340-(y-y0)/(y1-y0||1)*320;
runs.forEach((r,i)=>{{const c=`hsl(${{i*67%360}},70%,45%)`;const p=document.createElementNS('http://www.w3.org/2000/svg','polyline');
p.setAttribute('points',r.curve.map(q=>X(q[0])+','+Y(q[1])).join(' '));p.setAttribute('fill','none');p.setAttribute('stroke',c);svg.appendChild(p);
const t=document.createElementNS('http://www.w3.org/2000/svg','text');t.setAttribute('x',560);t.setAttribute('y',20+i*14);t.setAttribute('fill',c);t.setAttribute('font-size',11);t.textContent=r.name;svg.appendChild(t);}});}}
</script></body></html>"""
