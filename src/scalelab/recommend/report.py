"""What `scalelab recommend` writes: recommendation.json (the whole answer, stable keys), a
markdown summary, and an HTML page that is the comparison dashboard of the verification and LR
runs (results/report.py) with the recommendation's tables on top."""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

from scalelab.plan.report import fmt_bytes, fmt_time

from .space import MEMORY_PRUNES

_UNIT = {"throughput": "tokens/s", "time-to-tokens": "s to --tokens", "cost": "cost per token"}


def fmt_score(objective: str, x: float | None) -> str:
    if x is None:
        return "-"
    if objective == "throughput":
        return f"{x:,.0f} tok/s" if x >= 100 else f"{x:.3g} tok/s"
    if objective == "time-to-tokens":
        return fmt_time(x)
    return f"{x * 1e6:.4g} per 1M tokens"


def fmt_count(x: float) -> str:
    """7e9 -> 7B, 1.3e9 -> 1.3B, 350e6 -> 350M: a --params value as it is usually written."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.4g}{unit}"
    return f"{x:.4g}"


def ranking_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    obj = doc["objective"]
    # '#' is the recommended order (ties within the planner's margin broken by simplicity: doc["tie"]);
    # 'pred #' the order by prediction alone
    head = ["#", "strategy", "devices", "dp", "tp", "pp", "micro x m", "ckpt", "precision", "memory/device",
            f"predicted ({_UNIT[obj]})", "pred #", "bound", "why"]
    # several --global-batch values searched: which a row is (worked out from micro x m x dp before)
    batches = len((doc.get("request") or {}).get("global_batches") or []) > 1
    if batches:
        head.insert(6, "batch")
    rows = []
    for i, c in enumerate(doc["ranking"], 1):
        pred = str(c.get("predicted_rank", i)) + (" tie" if c.get("tied") else "")
        rows.append([str(i), c["strategy"], f"{c['nodes']}x{c['devices']}", str(c["dp"]), str(c["tp"]), str(c["pp"]),
                     *([str(c["global_batch"])] if batches else []),
                     f"{c['micro_batch']} x {c['micro_batches']}", c["activation_checkpointing"], c["precision"],
                     fmt_bytes(c["predicted_total_bytes"]), fmt_score(obj, c["predicted_score"]), pred,
                     c["reason"]["bound"], c["reason"]["text"]])
    return head, rows


# under a ranking of several global batches: throughput rises with the batch, what a step learns does not
BATCH_CAVEAT = ("note: several global batches searched: a larger batch's higher throughput is not faster training "
                "(fewer optimizer steps per sample; the LR must follow it): compare batches by the loss they reach "
                "(--verify's LR check, or a sweep)")


def verify_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    obj = doc["objective"]
    head = ["measured #", "planner #", "strategy", "micro x m", "predicted step", "measured step",
            "pred/meas", "pred/meas at host speed", "memory pred/meas", f"measured ({_UNIT[obj]})", "loss final",
            "status"]
    rows = []
    for i, v in enumerate(doc["verification"]["ranking"], 1):
        ok = "measured_step_s" in v
        rows.append([str(i) if ok else "-", str(v["planner_rank"]), v["strategy"], v["split"],
                     fmt_time(v["predicted_step_s"]), fmt_time(v["measured_step_s"]) if ok else "-",
                     f"{v['step_ratio']:.2f}" if ok else "-",
                     f"{v['step_ratio_at_host_speed']:.2f}" if ok else "-",
                     f"{v['memory_ratio']:.2f} ({v['memory_measure']})" if ok and v.get("memory_ratio") else "-",
                     fmt_score(obj, v.get("measured_score")), _verified_loss(v) if ok else "-",
                     v["status"] + (f": {v['error']}" if v.get("error") else "")])
    return head, rows


DIVERGED = "diverged (NaN/inf loss)"


def fmt_loss(x, diverged: bool = False, digits: int = 4) -> str:
    """A loss; "nan" for a diverged run's null or NaN/inf one (run.json writes NaN as null), else "-"."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return f"{x:.{digits}f}"
    if isinstance(x, float):
        return str(x)   # an older record's nan / inf
    return "nan" if diverged else "-"


def _verified_loss(v: dict) -> str:
    """A verified candidate's final loss (median of its runs' finite ones), with how many diverged."""
    n = v.get("loss_diverged") or 0
    if v.get("loss_final") is None:
        return "nan (diverged)" if n else "-"
    return fmt_loss(v["loss_final"]) + (f" ({n} of {v.get('runs', n)} diverged)" if n else "")


def lr_table(doc: dict) -> tuple[list[str], list[list[str]]]:
    check = doc["lr"]["check"]
    head = [check["varied"], "lr used", "loss first", "loss final", "loss, last 25 % of steps",
            "loss curve (step: loss)", "status"]
    rows = []
    for r in check["runs"]:
        curve = r["curve"]
        picks = [curve[int(i * (len(curve) - 1) / 4)] for i in range(5)] if curve else []
        # a diverged run (NaN/inf loss, written as null): "nan" where its losses are, and picked by none
        div = bool(r.get("diverged"))
        status = r["status"] or "-"
        if div:
            status = DIVERGED if status == "completed" else f"{status}, {DIVERGED}"
        rows.append([str(r["value"]), f"{r['lr']:.4g}" if r["lr"] is not None else "-",
                     fmt_loss(r["loss_first"], div), fmt_loss(r["loss_final"], div), fmt_loss(r["loss_tail"], div),
                     ", ".join(f"{int(s)}: {fmt_loss(v, True, 3)}" for s, v in picks), status])
    return head, rows


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    return "\n".join(["| " + " | ".join(map(esc, head)) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(map(esc, r)) + " |" for r in rows)])


def text_table(head: list[str], rows: list[list[str]], drop: tuple[str, ...] = ("why",)) -> str:
    keep = [i for i, h in enumerate(head) if h not in drop]
    head, rows = [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(n) for c, n in zip(cells, w)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * n for n in w]), *map(line, rows)])


def markdown(doc: dict) -> str:
    req, win, lr = doc["request"], doc["winner"], doc["lr"]
    # as the console says it (recommend._say_ranking): of the layouts built, not of those skipped whole
    too_big = sum(n for why, n in doc["search"]["pruned"].items() if why.startswith(MEMORY_PRUNES))
    out = [f"# ScaleLab recommendation: {req['model']['name']} on {req['nodes']}x{req['devices']} {req['hardware']}",
           "", f"Objective: **{doc['objective']}**; global batch {', '.join(map(str, req['global_batches']))}; "
           f"{doc['search']['fitting']} of {doc['search']['fitting'] + too_big} layouts fit device memory "
           f"({doc['search']['built']} considered, {doc['search']['pruned_total']} pruned).", ""]
    m = req["model"]
    if m.get("shape_inferred"):
        out += [f"Model: {m['layers']} layers x hidden {m['hidden']}, {m['heads']} heads, vocab {m['vocab']}, seq "
                f"{m['seq_len']}: **{m['n_params']:,} parameters** exactly (the GPT scalelab-train builds, the shape "
                f"guessed for --params {fmt_count(m.get('params_asked') or m['n_params'])}).", ""]
    budget = (doc.get("budget") or {}).get("note")
    if budget:
        out += [f"**Budget**: {budget}.", ""]
    if doc.get("warning"):       # more devices per node than the profile's node has (recommend.py)
        out += [f"**Warning**: {doc['warning']}.", ""]
    if win:
        out += [f"**Run this** ({win['source']}): `{win['command']}`", "", f"Why: {win['reason']}", ""]
    elif doc.get("error"):       # verification asked and none of its jobs started (recommend.py)
        out += [f"**Error**: {doc['error']}.", ""]
    else:
        out += ["**No layout fits** (see Pruned below).", ""]
    out += ["## Planner ranking (best layout of each strategy)", "", markdown_table(*ranking_rows(doc)), ""]
    if (doc.get("tie") or {}).get("note"):
        out += [doc["tie"]["note"][:1].upper() + doc["tie"]["note"][1:] + ".", ""]
    if doc["search"]["pruned"]:
        out += ["Pruned: " + "; ".join(f"{k} ({v})" for k, v in doc["search"]["pruned"].items()), ""]
    if doc.get("rejected_by_trainer"):
        out += ["Refused by the trainer's validation: " + "; ".join(
            f"{r['strategy']}: {r['error']}" for r in doc["rejected_by_trainer"]), ""]
    if doc.get("verification"):
        v = doc["verification"]
        out += ["## Verification (short real runs, re-ranked on measured figures)", "",
                f"`scalelab-train {' '.join(v['argv'])}` ({v['steps']} steps each, {v['wall_s']:.0f} s); "
                f"sweep: `{v['sweep_dir']}`", "", markdown_table(*verify_rows(doc)), "",
                f"Measured best: **{v['measured_best']}** (#{v['measured_best_index'] + 1} of the recommended order; "
                "'pred #' in the ranking is its place by prediction alone)."
                if v["measured_best"] else "No verification run completed.", *([v["note"]] if v.get("note") else []),
                ""]
    caveat = f"; caveat: {lr['advice']['caveat']}" if lr["advice"].get("caveat") else ""
    out += ["## Learning rate", "", f"Rule **{lr['advice']['rule']}**, LR {lr['advice']['lr']:.4g} "
            f"(base {lr['advice']['base_lr']:g} at batch {lr['advice']['base_batch']}{caveat}), warmup "
            f"{lr['advice']['warmup_steps']}: {lr['advice']['why']}.", "",
            "| rule | LR at batch %d |" % lr["advice"]["global_batch"], "|---|---|",
            *(f"| {r} | {v:.4g} |" for r, v in lr["advice"]["by_rule"].items()), ""]
    if lr.get("check"):
        c = lr["check"]
        div = (f"; diverged (NaN/inf loss, not picked): {', '.join(map(str, c['diverged']))}"
               if c.get("diverged") else "")
        out += [f"Short LR check (`scalelab-train {' '.join(c['argv'])}`, {c['wall_s']:.0f} s): lowest training "
                f"loss over the last quarter of the steps with {c['varied']}={c['best']}{div}; loss curves: "
                f"`{c['report']}`.", "", markdown_table(*lr_table(doc)), ""]
    return "\n".join(out)


def _inline(text: str) -> str:
    """One line of the summary's markdown as escaped HTML: `code` spans (kept literal) and **bold**."""
    parts = text.split("`")
    if len(parts) % 2 == 0:   # an unpaired backtick is text
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else
                   re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(p)) for i, p in enumerate(parts))


def _cells(row: str) -> list[str]:
    """A pipe-table row's cells (markdown_table escapes a literal | as \\|)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip()[1:-1])]


def _html_table(lines: list[str]) -> str:
    head, *rows = [_cells(ln) for ln in lines if not re.fullmatch(r"\|[-:| ]+\|", ln.strip())]
    th = "".join(f"<th>{_inline(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<div class="scroll"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def markdown_html(md: str, shift: int = 1) -> str:
    """The summary's markdown (markdown() writes only headings, paragraphs with **bold** and `code`,
    pipe tables and - lists) as HTML, with no markdown package; headings one level down (SHIFT)
    under the page's own <h1>."""
    blocks: list[tuple[str, list[str]]] = []
    for line in md.splitlines():
        kind = ("blank" if not line.strip() else "h" if re.match(r"#{1,6} ", line) else
                "table" if line.lstrip().startswith("|") else "li" if re.match(r"[-*] ", line) else "p")
        if blocks and kind == blocks[-1][0] and kind not in ("h", "blank"):
            blocks[-1][1].append(line)
        else:
            blocks.append((kind, [line]))
    out = []
    for kind, lines in blocks:
        if kind == "h":
            hashes, text = lines[0].split(" ", 1)
            level = min(6, len(hashes) + shift)
            out.append(f"<h{level}>{_inline(text.strip())}</h{level}>")
        elif kind == "table":
            out.append(_html_table(lines))
        elif kind == "li":
            out.append("<ul>" + "".join(f"<li>{_inline(ln[2:].strip())}</li>" for ln in lines) + "</ul>")
        elif kind == "p":
            out.append(f"<p>{_inline(' '.join(ln.strip() for ln in lines))}</p>")
    return "\n".join(out)


SUMMARY_STYLE = ("<style>.summary td,.summary th{text-align:left;white-space:normal;min-width:3em}.summary .scroll"
                 "{max-height:none}.summary code{background:#f4f4f4;padding:0 .2em;word-break:break-all}</style>")


def sweep_names(doc: dict) -> dict[str, str]:
    """The chart labels of recommend's two sweeps: without them the LR-check runs (other LRs) were
    pooled with the verification runs, and the winner's chart figure was not the table's."""
    names = {}
    if doc.get("verification"):
        names[doc["verification"]["sweep_dir"]] = "verification"
    if (doc.get("lr") or {}).get("check"):
        names[doc["lr"]["check"]["sweep_dir"]] = "LR check"
    return names


def write_all(doc: dict, out: Path, records: list[dict], summaries: list[dict]) -> dict[str, Path]:
    """recommendation.json, recommendation.md and (when runs were made) recommendation.html."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "recommendation.json", "markdown": out / "recommendation.md"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    md = markdown(doc)
    paths["markdown"].write_text(md + "\n")
    if records:
        from scalelab.results.report import render_html

        page = render_html(records, summaries, title="ScaleLab recommendation: verification and LR runs",
                           sweep_names=sweep_names(doc))
        summary = f'<section class="summary">{SUMMARY_STYLE}{markdown_html(md)}</section>'
        page = page.replace("</h1>", "</h1>" + summary, 1)
        paths["html"] = out / "recommendation.html"
        paths["html"].write_text(page)
    return paths

