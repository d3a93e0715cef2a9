"""The comparison dashboard: one self-contained HTML file (Plotly's JS inline, no request leaves
it: a Content-Security-Policy blocks any), rendering the chart data of results/charts.py, a
sortable run table (every run.json field, flattened) and the failed runs with their errors.

The page checks itself: once every chart is drawn it writes `{"charts": {id: {"data": n,
"rendered": n}}, "errors": [...]}` into `<pre id="scalelab-selfcheck">` (hidden), so a headless
browser's DOM dump tells whether each chart drew its traces and whether any script failed.
"""
from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path

from scalelab.results import charts as C
from scalelab.results.sweep import NO_RECORD_WHY
from scalelab.results.table import (_cells, _columns, _show, flatten, job_labels, lookup, notes,
                                    oversubscribed)

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")
# Plotly's default qualitative palette, then ten more distinct colours. Strategies take the first
# ones in sorted order, for the whole page: colours that followed trace order gave ddp a different
# colour on each chart. Series that are not strategies (memory parts, LR rules) take the rest.
PALETTE = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
           "#FECB52", "#8C564B", "#BCBD22", "#00A08B", "#750D86", "#B68100", "#862A16", "#1616A7", "#6C7C32",
           "#DA16FF", "#0D2A63"]
# Series of one strategy on one chart (two sweeps, two batch sizes) share its colour: told apart by these.
DASHES = ["solid", "dot", "dash", "longdash", "dashdot", "longdashdot"]
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross"]
LEGEND_RIGHT_MAX = 24   # longer series names: the legend goes below the plot, not beside it


def strategy_colors(records_or_traces: list[dict]) -> dict[str, str]:
    """{strategy: colour}, one per strategy of the report (sorted, so stable for one set of runs)."""
    names = sorted({str(r["strategy"]) for r in records_or_traces if r.get("strategy") is not None})
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(names)}


def trace_styles(traces: list[dict], colors: dict[str, str]) -> list[tuple[str, int]]:
    """(colour, variant) of each trace: a strategy's series its colour, variants 0, 1, ... in turn
    within this chart; other series the colours after the strategies'; the ideal line grey."""
    seen: dict[str, int] = defaultdict(int)
    out, other = [], 0
    for t in traces:
        key = t.get("strategy")
        if t.get("dash"):
            out.append(("#444", 0))
        elif key in colors:
            out.append((colors[key], seen[key]))
            seen[key] += 1
        else:
            out.append((PALETTE[(len(colors) + other) % len(PALETTE)], 0))
            other += 1
    return out


def _js(obj) -> str:
    """A JS literal that cannot end its <script> element."""
    return json.dumps(obj, default=str).replace("</", "<\\/")


def figure(ch: dict, colors: dict[str, str] | None = None) -> dict:
    """Plotly {data, layout} of one chart dict; COLORS: {strategy: colour} of the whole page
    (default: this chart's strategies)."""
    data = []
    styles = trace_styles(ch["traces"], strategy_colors(ch["traces"]) if colors is None else colors)
    for t, (color, k) in zip(ch["traces"], styles):
        d = {"name": t["name"], "x": t["x"], "y": t["y"]}
        if ch["kind"] == "bar":
            d.update(type="bar", marker={"color": color})
        else:
            d.update(type="scatter", mode="lines" if t.get("dash") or len(t["x"]) > 30 else "lines+markers",
                     line={"color": color, "dash": "dash" if t.get("dash") else DASHES[k % len(DASHES)]},
                     # past 6 series of one colour, the marker moves on by one more: 36 distinct
                     # (dash, marker) pairs, where the 7th series was drawn as the 1st
                     marker={"color": color, "symbol": SYMBOLS[(k + k // len(DASHES)) % len(SYMBOLS)]})
        if t.get("text"):   # hover only (bar `text` would print inside the bars)
            d.update(hovertext=t["text"], hovertemplate="%{x}: %{y:.4g}<br>%{hovertext}<extra>%{fullData.name}</extra>")
        data.append(d)
    layout = {"title": {"text": ch["title"], "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
              "margin": {"l": 60, "r": 20, "t": 60, "b": 60},
              "xaxis": {"title": {"text": ch["x_title"]}, "automargin": True},
              "yaxis": {"title": {"text": ch["y_title"]}, "automargin": True, "rangemode": "tozero"},
              "legend": {"font": {"size": 10}}, "hovermode": "closest", "height": 420}
    if ch["kind"] == "bar":
        layout.update(barmode=ch["barmode"] or "group")
        layout["xaxis"]["type"] = "category"
    elif ch["id"].startswith(("efficiency", "throughput")):
        layout["xaxis"].update(type="log", dtick=0.30102999566)   # world sizes 1, 2, 4, 8 ...
        if ch["id"] == "throughput":
            layout["yaxis"].update(type="log", rangemode="normal")
    elif ch["id"] == "loss":
        layout["yaxis"]["rangemode"] = "normal"
    elif ch["id"] == "lr_scaling":
        # final losses 3.998 vs 4.075 drew as one flat line from 0; batch sizes double: a log axis
        layout["yaxis"]["rangemode"] = "normal"
        layout["xaxis"].update(type="log", dtick=0.30102999566)
    _legend_below(layout, [t["name"] for t in ch["traces"]])
    if not ch["traces"]:
        layout["annotations"] = [{"text": "no data: " + "; ".join(ch["notes"])[:160], "showarrow": False,
                                  "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]
        layout["xaxis"]["visible"] = layout["yaxis"]["visible"] = False
    return {"data": data, "layout": layout}


def _legend_below(layout: dict, names: list[str]) -> None:
    """Long series names (two sweeps, --group-by): the legend below the plot, the figure taller by
    its rows (~6 px a character, in a card ~540 px wide). Beside the plot it took the plot's width."""
    if max(map(len, names), default=0) <= LEGEND_RIGHT_MAX:
        return
    rows, used = 1, 0
    for n in names:
        w = 40 + 6 * len(n)
        rows, used = (rows + 1, w) if used and used + w > 540 else (rows, used + w)
    layout["legend"].update(orientation="h", x=0, xanchor="left", y=-0.16, yanchor="top")
    layout["height"] += 22 * rows
    layout["margin"]["b"] += 22 * rows


def _table(table_id: str, heads: list[str], rows: list[list[str]], failed: list[bool], errors: list[str],
           crowded: list[str] | None = None) -> str:
    """CROWDED: each row's oversubscription (table.oversubscribed, in words; "" where none): the row
    is marked (class oversubscribed) and says it on hover, where no error does."""
    th = "".join(f'<th title="sort by {html.escape(h)}">{html.escape(h)}</th>' for h in heads)
    body = "".join(
        "<tr" + (" class=failed" if bad else " class=oversubscribed" if why else "")
        + (' title="%s"' % html.escape(err or why, quote=True) if err or why else "")
        + ">" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        for cells, bad, err, why in zip(rows, failed, errors, crowded or [""] * len(rows)))
    return f'<div class="scroll"><table class="sortable" id="{table_id}"><thead><tr>{th}</tr></thead>' \
           f"<tbody>{body}</tbody></table></div>"


def _field(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list) and len(v) > 8:
        return f"[{len(v)} items]"
    if isinstance(v, float):
        return f"{v:.6g}"
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def tables(records: list[dict], group_by: str | None = None) -> tuple[str, str]:
    """The run table (the compare columns) and every field, flattened."""
    bad = [r.get("status") != "completed" for r in records]
    errs = [str(r.get("error") or "") for r in records]
    cols = _columns(records)
    heads = ([group_by] if group_by else []) + [c[0] for c in cols]
    lead = [[_show(lookup(r, group_by))] if group_by else [] for r in records]
    labels = job_labels(records)   # a job name runs of two sweeps share: "A/sw/0", "B/sw/0" (as compare's table)
    crowded = [f"oversubscribed: {o[0]} ranks x {o[1]} thread(s) on {o[2]} cores (figures not comparable)"
               if (o := oversubscribed(r)) else "" for r in records]
    summary = _table("runs", heads, [g + _cells(r, cols, labels.get(id(r))) for g, r in zip(lead, records)],
                     bad, errs, crowded)
    # the marks' footnotes (a short run's "*", an oversubscribed run's "!"), as under compare's table
    summary += "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes(records, labels))
    flat = [flatten(r) for r in records]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    full = _table("fields", keys, [[_field(f.get(k)) for k in keys] for f in flat], bad, errs)
    return summary, full


# The run table's click-to-sort. A cell that is no value ("-") or no finite number ("nan", "inf": a
# diverged loss) sorts last either way, as `compare --sort` puts them: "nan" sorted as text among
# numbers left the column out of order. A number with its table marks ("2.0*", "8!") or words after
# it ("0.80* (vs 2)", "0.91 weak": efficiency cells) sorts by the number (the column sorted as text).
SORT_JS = """
document.querySelectorAll('table.sortable').forEach(t=>{t.querySelectorAll('th').forEach((th,i)=>{
 th.addEventListener('click',()=>{const tb=t.tBodies[0],rows=[...tb.rows],asc=th.dataset.dir!=='asc';
  t.querySelectorAll('th').forEach(h=>delete h.dataset.dir);th.dataset.dir=asc?'asc':'desc';
  rows.sort((a,b)=>sortCmp(a.cells[i].textContent,b.cells[i].textContent,asc));
  rows.forEach(r=>tb.appendChild(r));});});});
"""
CMP_JS = """
function sortVal(text){const s=text.trim();if(s==='-'||/^[-+]?(nan|inf|infinity)[*!]?$/i.test(s))return null;
 const m=s.match(/^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[*!]?(?:\s.*)?$/);return m?parseFloat(m[1]):s;}
function sortCmp(p,q,asc){const x=sortVal(p),y=sortVal(q);
 if(x===null||y===null)return (x===null)-(y===null);
 const c=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y),undefined,{numeric:true});
 return asc?c:-c;}
"""
# Installed before Plotly: every error on the page (scripts, promises, blocked requests) is kept.
PROBE_JS = """window.__scalelabErrors=[];
window.addEventListener('error',e=>__scalelabErrors.push('error: '+(e.message||e.type)));
window.addEventListener('unhandledrejection',e=>__scalelabErrors.push('rejection: '+String(e.reason)));
document.addEventListener('securitypolicyviolation',e=>__scalelabErrors.push('blocked: '+e.blockedURI));
(function(){const ce=console.error;console.error=function(){__scalelabErrors.push('console: '+
 [...arguments].map(String).join(' '));return ce.apply(console,arguments);};})();"""
DRAW_JS = """
const cfg={displaylogo:false,responsive:true,displayModeBar:'hover',modeBarButtonsToRemove:['sendDataToCloud']};
Promise.all(Object.entries(FIGS).map(([id,f])=>Plotly.newPlot(id,f.data,f.layout,cfg).then(gd=>
  [id,{data:gd.data.length,rendered:gd.querySelectorAll('.trace').length}])))
 .then(done=>{document.getElementById('scalelab-selfcheck').textContent=
   JSON.stringify({charts:Object.fromEntries(done),errors:__scalelabErrors});})
 .catch(e=>{__scalelabErrors.push('plot: '+e);document.getElementById('scalelab-selfcheck').textContent=
   JSON.stringify({charts:{},errors:__scalelabErrors});});
"""
STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1{margin:0 0 .2em}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:1em}
.card{border:1px solid #ddd;border-radius:6px;padding:.4em}.note{color:#666;font-size:.85em;margin:.2em .6em}
.scroll{overflow:auto;max-height:70vh;border:1px solid #ddd}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#eee;cursor:pointer;position:sticky;top:0}th[data-dir=asc]::after{content:' \\25B2'}
th[data-dir=desc]::after{content:' \\25BC'}tr.failed td{color:#b00;background:#fee}
tr.oversubscribed td{background:#fff3d6}
.failed-list li{color:#b00}"""


def render_html(records: list[dict], summaries: list[dict], group_by: str | None = None,
                title: str = "ScaleLab comparison", cache: str | Path | None = None,
                sweep_names: dict | None = None) -> str:
    """The page. SWEEP_NAMES ({sweep dir: label}) names the series of runs from several sweeps
    (default: each sweep dir's name)."""
    import plotly.offline

    chs = C.all_charts(records, summaries, group_by, cache, sweep_names)
    colors = strategy_colors(records)
    figs = {ch["id"]: figure(ch, colors) for ch in chs}
    cards = "".join(
        f'<div class="card"><div id="{ch["id"]}" class="chart"></div>'
        + "".join(f'<p class="note">{html.escape(n)}</p>' for n in ch["notes"]) + "</div>" for ch in chs)
    fails = C.failed(records)
    # jobs with no usable record (an unreadable run.json; a job folder with none: a killed launcher)
    # are in no table or chart: listed here and counted in the headline, not left out unsaid
    unread = [line for s in summaries for line in s.get("skipped") or []]
    unrecorded = [str(Path(s["sweep_dir"]) / n) for s in summaries for n in s.get("no_record") or []]
    items = ([f"<li><b>{html.escape(f['job'])}</b> ({html.escape(str(f['strategy']))} x{f['world_size']}): "
              f"{html.escape(f['error'] or f['status'] or '')}</li>" for f in fails]
             + [f"<li><b>unreadable</b> {html.escape(line)}</li>" for line in unread]
             + [f"<li><b>no record</b> {html.escape(d)}: {html.escape(NO_RECORD_WHY)}</li>" for d in unrecorded])
    fail_html = f"<ul class=failed-list>{''.join(items)}</ul>" if items else "<p>none</p>"
    missing = "".join(f", {n} {what}" for n, what in ((len(unread), "unreadable run.json"),
                                                      (len(unrecorded), "job folder(s) without a record")) if n)
    summary, full = tables(records, group_by)
    n_ok = sum(r.get("status") == "completed" for r in records)
    sweeps = ", ".join(html.escape(str(s.get("sweep_dir"))) for s in summaries) or "-"
    if title == "ScaleLab comparison" and len(summaries) == 1 and summaries[0].get("sweep_dir"):
        title += f": {Path(str(summaries[0]['sweep_dir'])).name}"   # browser tabs of two sweeps told apart
    from scalelab.results.callbacks import cpu_note

    note = cpu_note(records)   # the console said it under the table; the page, where efficiencies are read, did not
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><style>{STYLE}</style>
<script>{PROBE_JS}</script>
<script>{plotly.offline.get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
<p>{len(records)} runs: {n_ok} completed, {len(records) - n_ok} failed{missing}. Sweeps: {sweeps}.
{f"Grouped by <code>{html.escape(group_by)}</code>." if group_by else ""}</p>
{f'<p class="note">{html.escape(note)}</p>' if note else ""}
<div class="grid">{cards}</div>
<h2>Runs</h2><p class="note">Click a column to sort. Failed runs in red (hover for the error); runs whose
ranks shared cores (oversubscribed, world marked !) in amber.</p>{summary}
<h2>Failed runs</h2>{fail_html}
<details><summary><b>Every run.json field</b> (flattened; long lists shown as their length)</summary>{full}</details>
<pre id="scalelab-selfcheck" hidden></pre>
<script>const FIGS={_js(figs)};{DRAW_JS}{CMP_JS}{SORT_JS}</script>
</body></html>
"""


def write_report(path: Path | str, records: list[dict], summaries: list[dict], **kw) -> Path:
    from scalelab.results.table import sort_records

    path = Path(path)
    path.write_text(render_html(sort_records(records, None), summaries, **kw))
    return path
