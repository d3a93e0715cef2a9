"""The recommendation: search and rank with the planner, keep what the trainer accepts, verify the
top K with short runs, answer the LR question, write and print the result."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from scalelab.paths import command
from scalelab.plan.spec import PlanError

from . import lr as lr_mod
from . import verify as V
from scalelab.plan.hardware import devices_per_node_warning
from scalelab.plan.report import fmt_bytes, fmt_time

from .rank import PLANNER_MARGIN, SIMPLICITY, best_per_strategy, break_ties, rank, reason, score, tokens_per_s
from .report import BATCH_CAVEAT, fmt_count, fmt_score, lr_table, ranking_rows, text_table, verify_rows, write_all
from .space import MEMORY_PRUNES, Candidate, Request, enumerate_candidates, train_overrides, unrunnable

# Run-to-run spread of one short run's throughput on a shared host (README: 10-25 % between runs of
# one config on the 2-core VM; 5 % between interleaved ones): a measured lead below it is not one.
NOISE = 0.05


def trainer_check(c: Candidate, req: Request, same_model: bool = True) -> tuple[list[str] | None, str | None]:
    """(overrides, None) when `scalelab-train OVERRIDES` composes, validates and derives this very
    layout (plan_job.terms_for_job: the trainer's own config code), and with same_model builds the
    model planned (its count); else (overrides or None, why)."""
    from scalelab.plan_job import terms_for_job

    try:
        ov = train_overrides(c, req)
        # validated for the profile's device kind: a GPU profile given as a path has no
        # hardware_profile= in the overrides, and was checked as a CPU job (fp16 ZeRO refused)
        terms, _ = terms_for_job(ov, target=req.hardware.kind)
    except PlanError as exc:
        return None, str(exc)
    L = terms.layout
    got = (terms.strategy.name, L.dp, L.tp, L.pp, L.micro_batch, L.micro_batches, terms.checkpointing, terms.precision)
    want = (c.strategy, c.dp, c.tp, c.pp, c.micro_batch, c.micro_batches, c.checkpointing, c.precision)
    if got != want:
        return ov, f"the trainer derives {got} from these overrides, not {want}"
    # the model too: a shape with another count asked (--params 7B --layers 4 ...) was planned at 7e9
    # and printed as a command building the shape's 29.4M
    built, planned = terms.model.n_params, c.terms.model.n_params
    if same_model and built != planned:
        return ov, f"these overrides build a {built:,}-parameter model, not the {planned:,} planned"
    return ov, None


def shortlist(ranked: list[Candidate], req: Request, need: int, tries_per_strategy: int = 2, same_model: bool = True):
    """The best candidate of each strategy that the trainer accepts, in rank order, up to `need`;
    and the ones it refused (a refusal is usually the strategy's, so each gets a second try only).
    same_model: see trainer_check (off where no command is printed: published.py)."""
    shown: list[tuple[Candidate, list[str]]] = []
    rejected: list[dict] = []
    tries: dict[str, int] = {}
    for c in ranked:
        if len(shown) >= need:
            break
        if any(s.strategy == c.strategy for s, _ in shown) or tries.get(c.strategy, 0) >= tries_per_strategy:
            continue
        tries[c.strategy] = tries.get(c.strategy, 0) + 1
        ov, why = trainer_check(c, req, same_model)
        if why:
            rejected.append({"strategy": c.strategy, "layout": c.label(), "error": why})
        else:
            shown.append((c, ov))
    return shown, rejected


def candidate_doc(c: Candidate, ov: list[str], req: Request, objective: str, tokens, budget_s) -> dict:
    from .cli import command_line

    d = {"strategy": c.strategy, "devices": c.devices, "nodes": c.nodes, "world_size": c.world, "dp": c.dp,
         "tp": c.tp, "pp": c.pp, "micro_batch": c.micro_batch, "micro_batches": c.micro_batches,
         "global_batch": c.global_batch, "activation_checkpointing": c.checkpointing, "precision": c.precision,
         "predicted_step_s": c.times["step_s"], "predicted_tokens_per_s": tokens_per_s(c),
         "predicted_score": score(c, objective, req.hardware, tokens), "predicted_total_bytes": c.memory_bytes,
         "device_memory_bytes": req.hardware.memory_bytes, "predicted_time": c.times,
         "reason": reason(c, req.hardware), "overrides": ov, "command": command_line(ov)}
    if tokens:
        d["predicted_time_to_tokens_s"] = float(tokens) / tokens_per_s(c)
        if budget_s:
            d["within_budget"] = d["predicted_time_to_tokens_s"] <= budget_s
    return d


def recommend(req: Request, *, objective: str, tokens=None, budget_s=None, verify: int = 0, verify_steps: int = 20,
              verify_repeats: int = 1, lr_check: str = "none", lr_steps: int = 30, base_lr: float, base_batch: int,
              slurm: bool = False, extra: list[str] | None = None, top: int = 10, out: Path,
              quiet: bool = False, lr_caveat: str | None = None) -> dict:
    """The whole answer as the recommendation.json document; prints as it goes unless quiet.
    lr_caveat: said with the LR advice (a base LR not tuned for this model: recommend/cli.py)."""
    say = (lambda *a: None) if quiet else print
    extra = list(extra or [])
    t0 = time.perf_counter()
    smallest: dict[str, float] = {}
    unsplit: dict[str, set] = {}
    cands, pruned = enumerate_candidates(req, smallest, unsplit)
    excluded = unrunnable(req)
    ranked = rank(cands, objective, req.hardware, tokens, budget_s)
    # the tie over every strategy's best the trainer accepts, then cut for display: cut first, the
    # answer depended on --top ("strategies shown": --top 1 gave zero3, --top 3 zero1, the default ddp)
    shown, rejected = shortlist(ranked, req, len(best_per_strategy(ranked)))
    shown, predicted_rank, tie = _break_ties(shown, objective, req, tokens, budget_s)
    keep = max(top, verify)
    shown, predicted_rank = shown[:keep], predicted_rank[:keep]
    doc = {"objective": objective, "request": _request_doc(req, tokens, budget_s),
           "search": {"built": len(cands) + sum(pruned.values()), "fitting": len(cands),
                      "pruned_total": sum(pruned.values()), "pruned": pruned, "strategies_fitting":
                      len(best_per_strategy(ranked)), "seconds": round(time.perf_counter() - t0, 2),
                      "excluded": excluded, "fits_nowhere": _fits_nowhere(req, cands, smallest, excluded),
                      "batch_unsplit": _batch_unsplit(req, cands, unsplit, excluded)},
           "ranking": [{**candidate_doc(c, ov, req, objective, tokens, budget_s), "predicted_rank": r,
                        "tied": bool(tie) and c.strategy in tie["strategies"]}
                       for (c, ov), r in zip(shown, predicted_rank)],
           "tie": tie, "budget": _budget(ranked, tokens, budget_s),
           "rejected_by_trainer": rejected, "verification": None, "winner": None}
    # more devices per node than the profile's node has (this_cpu: cores): plan's warning, on stderr
    # also under --json (recommend --devices 8 --hardware this_cpu predicted 21k tok/s without a word)
    warning = devices_per_node_warning(req.devices, req.hardware)
    if warning:
        doc["warning"] = warning
        print(f"warning: {warning}", file=sys.stderr)
    _say_ranking(doc, say)
    if not shown:
        why = "no layout fits device memory" if not cands else "the trainer refused every fitting layout"
        doc["lr"] = {"advice": {**lr_mod.advice(req.optimizer, base_lr, base_batch, req.global_batches[0]),
                                "caveat": lr_caveat}}
        _finish(doc, out, [], [], say)
        if not cands and smallest:   # the closest layout and what it lacks (the whole prune tally: in the json)
            name = min(smallest, key=smallest.get)
            hw = req.hardware
            print(f"error: {why}: the closest is {name}, whose smallest layout needs {fmt_bytes(smallest[name])} per "
                  f"device; {hw.name} has {fmt_bytes(hw.memory_bytes)}"
                  + (f" ({fmt_bytes(hw.memory_bytes * (1 - req.headroom))} less the {req.headroom:.0%} headroom)"
                     if req.headroom else "")
                  + ": more devices or nodes (sharded states shrink with them), "
                  "--activation-checkpointing full, or a smaller model (recommendation.json: search.pruned)",
                  file=sys.stderr)
            return doc
        print(f"error: {why}; pruned: " + "; ".join(f"{k} ({v})" for k, v in pruned.items()), file=sys.stderr)
        return doc
    winner, source = doc["ranking"][0], "the planner's first"
    if tie:
        source = (f"the simplest of {len(tie['strategies'])} layouts predicted within the planner's "
                  f"{tie['margin']:.0%} margin")
    records, summaries = [], []
    if verify:
        doc["verification"], records, summaries = _verify(shown[:verify], doc, req, objective, tokens, verify_steps,
                                                          verify_repeats, out, extra, slurm, say)
        v = doc["verification"]
        say(f"\nverified ({v['steps']} steps each, {v['wall_s']:.0f} s):\n" + text_table(*verify_rows(doc)))
        if v.get("note"):
            say(v["note"])
        if not any("measured_score" in r for r in v["ranking"]):
            # no job left a record (sbatch refused them all, a launcher that did not start), or every
            # one failed (out of memory, a crash): the planner's pick was printed as "Run this", exit 0,
            # and its LR check run, on a layout the verification had just seen fail; no winner then
            log = out / "verify.log"
            failed = [r for r in v["ranking"] if r.get("runs")]
            if failed:
                r = failed[0]
                doc["error"] = (f"no verification job completed: {r['strategy']} {r['status']}"
                                + (f": {str(r['error']).strip().splitlines()[0][:200]}" if r.get("error") else "")
                                + f" (records under {out / 'verify'}; log: {log})")
            else:
                doc["error"] = (f"no verification job started (scalelab-train exited {v['returncode']}): "
                                f"{V.last_error(log) if log.is_file() else 'no log'} (log: {log})")
            doc["lr"] = {"advice": {**lr_mod.advice(req.optimizer, base_lr, base_batch, winner["global_batch"]),
                                    "caveat": lr_caveat}, "check": None}
            _finish(doc, out, records, summaries, say)
            print(f"error: {doc['error']}", file=sys.stderr)
            return doc
        best = doc["verification"]["measured_best_index"]
        if best is not None:
            winner, source = doc["ranking"][best], "measured best of the verified"
    adv = {**lr_mod.advice(req.optimizer, base_lr, base_batch, winner["global_batch"]), "caveat": lr_caveat}
    doc["lr"] = {"advice": adv, "check": None}
    # the winner's own candidate: the LR-check jobs ask SLURM for its devices and nodes
    chosen = shown[doc["ranking"].index(winner)][0]
    if lr_check == "grid":
        doc["lr"]["check"], lr_records, lr_sum = _lr_check(winner, adv, out, lr_steps, extra, slurm, chosen,
                                                           req.hardware.kind, say)
        records, summaries = records + lr_records, summaries + lr_sum
    # --train-arg: the verified jobs ran with it, so the command does too; hydra.* / hydra/...
    # (launcher settings of the verification sweep) are not the job's
    command = winner["overrides"] + adv["overrides"] + [e for e in extra if not e.lstrip("+~").startswith("hydra")]
    from .cli import command_line

    doc["winner"] = {**{k: winner[k] for k in ("strategy", "world_size", "dp", "tp", "pp", "micro_batch",
                                                 "micro_batches", "global_batch", "activation_checkpointing",
                                                 "precision")},
                     "source": source, "reason": winner["reason"]["text"],
                     "predicted_score": winner["predicted_score"], "measured_score": _measured(doc, winner),
                     "overrides": command,
                     "command": command_line(command)}
    _finish(doc, out, records, summaries, say)
    return doc


def _break_ties(shown, objective: str, req: Request, tokens, budget_s):
    """(shown reordered by rank.break_ties, each one's rank by prediction alone, the tie or None)."""
    cands = [c for c, _ in shown]
    order, tied = break_ties(cands, objective, req.hardware, tokens, budget_s)
    pos = {id(c): i for i, c in enumerate(cands)}
    tie = None
    if tied:
        names = [c.strategy for c in order[:len(tied)]]
        best = cands[0]
        tie = {"margin": PLANNER_MARGIN, "strategies": names, "predicted_best": best.strategy,
               "chosen": names[0], "simplicity_order": list(SIMPLICITY),
               "note": (f"tie: {', '.join(names)} are predicted within {PLANNER_MARGIN:.0%} of the best "
                        f"({best.strategy}, {fmt_score(objective, score(best, objective, req.hardware, tokens))}), "
                        f"inside the planner's margin of error; broken by simplicity (single, ddp, zero1, zero2, "
                        f"fsdp_grad_op, fsdp, zero3, offload, then tp/pipeline/nd): {names[0]} first"
                        + ("" if names[0] == best.strategy else f"; by prediction alone, {best.strategy}")
                        + " (column 'pred #')")}
    return [shown[pos[id(c)]] for c in order], [pos[id(c)] + 1 for c in order], tie


def _budget(ranked: list[Candidate], tokens, budget_s) -> dict | None:
    """Whether any fitting layout is predicted to train --tokens within --budget-minutes (how many
    do), and the fastest layout and its time."""
    if not (tokens and budget_s and ranked):
        return None
    fastest = min(ranked, key=lambda c: float(tokens) / tokens_per_s(c))
    t = float(tokens) / tokens_per_s(fastest)
    met = sum(float(tokens) / tokens_per_s(c) <= budget_s for c in ranked)
    # minutes as --budget-minutes is given (one decimal below 10: 2 min vs 2.3 min, not 2 vs 2), and
    # the time in its own unit where that is not minutes
    minutes = lambda x: (f"{x / 60:,.{1 if x < 600 else 0}f} min"  # noqa: E731
                         + ("" if fmt_time(x).endswith("min") else f" ({fmt_time(x)})"))
    note = None if met else (f"no layout meets the budget of {minutes(budget_s)}: the fastest, {fastest.label()}, "
                             f"is predicted to take {minutes(t)}")
    return {"budget_s": budget_s, "layouts_within": int(met), "fastest": fastest.label(), "fastest_s": t,
            "note": note}


def _request_doc(req: Request, tokens, budget_s) -> dict:
    m = req.model
    size = f"{m.n_params / 1e12:.3g}T" if m.n_params >= 1e12 else f"{m.n_params / 1e9:.3g}B"
    return {"model": {"name": req.model_name or f"{size} GPT", "n_params": m.n_params,
                      "layers": m.n_layers, "hidden": m.hidden, "heads": m.heads, "vocab": m.vocab,
                      "seq_len": m.seq_len, "shape_inferred": m.shape_inferred, "params_asked": req.params_asked},
            "hardware": req.hardware_name, "devices": req.devices, "nodes": req.nodes,
            "global_batches": list(req.global_batches), "precisions": list(req.precisions),
            "optimizer": req.optimizer, "strategies": list(req.strategies), "checkpointing": list(req.checkpointing),
            "tokens": tokens, "budget_s": budget_s}


def _multirun(argv: list[str], log: Path, what: str, say, announce: str) -> tuple[int, float]:
    """Validate, announce and run one scalelab-train multirun; (exit code, wall s). A refusal
    (exit 2: bad overrides) is an error here, a failed job is a measured outcome."""
    V.preflight_or_raise(argv)
    say(announce)
    t = time.perf_counter()
    rc = V.run_multirun(argv, log)
    wall = time.perf_counter() - t
    if rc == 2:
        raise PlanError(f"{what} refused by scalelab-train: {V.last_error(log)}")
    return rc, wall


def _verify(chosen, doc, req, objective, tokens, steps, repeats, out: Path, extra, slurm, say):
    cands = [c for c, _ in chosen]
    launch = V.slurm_overrides(cands, req.hardware.kind) if slurm else []
    argv = V.candidates_command(cands, [ov for _, ov in chosen], out, steps, launch + extra, repeats)
    rc, wall = _multirun(argv, out / "verify.log", "verification", say,
                         f"verifying the top {len(cands)}: {command('scalelab-train')} {' '.join(argv)}\n  (log: "
                         f"{out / 'verify.log'})")
    ranking, best, note = measured_ranking(cands, V.records_by_candidate(out / "verify"), objective, req, tokens)
    from scalelab.results.record import read_records
    from scalelab.results.sweep import aggregate

    records = read_records([out / "verify"], [])
    summaries = [aggregate(out / "verify", write=False)] if records else []
    return ({"k": len(cands), "steps": steps, "repeats": repeats, "argv": argv, "sweep_dir": str(out / "verify"),
             "returncode": rc, "wall_s": wall, "ranking": ranking, "measured_best_index": best,
             "measured_best": cands[best].label() if best is not None else None,
             "best_in_planner_top_k": best is not None, "note": note}, records, summaries)


def measured_ranking(cands: list[Candidate], recs: dict, objective: str, req: Request, tokens):
    """(rows best-measured first, the measured best's index in `cands`, a note when its lead is
    within run-to-run noise). Candidates without a measured figure (failed runs) come last."""
    from scalelab.plan.run_records import smooth_host_speeds

    # each run's host speed: the median probe of its neighbouring jobs, as plan --validate reads the
    # same runs (one probe is the noisier figure: ddp read 0.87 here and 0.644 there)
    smooth_host_speeds([(None, r, cands[i].terms) for i, rs in recs.items() if i < len(cands) for r in rs])
    rows = []
    for i, c in enumerate(cands):
        row = V.measured_row(c, recs.get(i, []), objective, req.hardware, tokens)
        rows.append({"planner_rank": i + 1, "strategy": c.strategy, "split": f"{c.micro_batch} x {c.micro_batches}",
                     **row})
    sign = -1 if objective == "throughput" else 1
    done = sorted((r for r in rows if "measured_score" in r), key=lambda r: sign * r["measured_score"])
    best = done[0]["planner_rank"] - 1 if done else None
    note = None
    if len(done) > 1:
        # noise: the spread of a candidate's own repeats where there are some, else a typical figure
        spreads = [max(r["measured_tokens_per_s_runs"]) / min(r["measured_tokens_per_s_runs"]) - 1
                   for r in done if len(r["measured_tokens_per_s_runs"]) > 1]
        noise = max([NOISE, *spreads])
        margin = abs(done[0]["measured_score"] / done[1]["measured_score"] - 1)
        if margin < noise:
            note = (f"the measured best leads the next by {margin:.1%}, within run-to-run noise ({noise:.0%}"
                    + (" between repeats" if spreads else " on a shared host") + "): these layouts are equivalent "
                    "here; more --verify-repeats or --verify-steps would separate them")
    return done + [r for r in rows if "measured_score" not in r], best, note


def _lr_check(winner: dict, adv: dict, out: Path, steps: int, extra, slurm, cand: Candidate, kind: str, say):
    varied, grid = lr_mod.check_grid(adv)
    launch = V.slurm_overrides([cand], kind) if slurm else []
    keep = [o for o in winner["overrides"] if not o.startswith(("optim.lr=", "lr_scaling"))]
    argv = ["-m", *V.with_extra([*launch, *extra]), *keep, *grid, f"hydra.sweep.dir={(out / 'lr_check').resolve()}",
            *V.short_run(steps)]
    rc, wall = _multirun(argv, out / "lr_check.log", "LR check", say, f"LR check: {command('scalelab-train')} {' '.join(argv)}")
    runs = V.lr_rows(out / "lr_check", varied)
    best = V.best_lr_run(runs)     # a diverged run (NaN/inf loss) is shown, never picked
    from scalelab.results.record import read_records

    records = read_records([out / "lr_check"], [])
    advised = adv["rule"] if varied == "lr_scaling" else adv["base_lr"]
    return ({"varied": varied, "argv": argv, "sweep_dir": str(out / "lr_check"), "returncode": rc, "wall_s": wall,
             "steps": steps, "runs": runs, "best": best["value"] if best else None,
             "diverged": [r["value"] for r in runs if r["diverged"]],
             "agrees_with_advice": bool(best) and _same_value(best["value"], advised),
             "report": str(out / "lr_check" / "report.html")}, records, [])


def _same_value(run_value, advised) -> bool:
    """Whether an LR-check run's value is the advised one: a rule by name, an LR as a number (the
    grid writes it with 6 significant digits, lr.check_grid: a --base-lr of 0.0012345678 ran as
    0.00123457, never equal as strings, and the advised LR's win read "a short run favours large LRs")."""
    try:
        return math.isclose(float(run_value), float(advised), rel_tol=1e-5)
    except (TypeError, ValueError):
        return str(run_value) == str(advised)


def _say_ranking(doc: dict, say) -> None:
    req, s = doc["request"], doc["search"]
    # of the layouts the planner built: a strategy skipped whole, or a batch that does not split, is
    # no layout that did not fit ("126 of 130 fit" counted 4 skipped strategies as 4 that did not)
    too_big = sum(n for why, n in s["pruned"].items() if why.startswith(MEMORY_PRUNES))
    say(f"{req['model']['name']} on {req['nodes']}x{req['devices']} {req['hardware']}, objective {doc['objective']}: "
        f"{s['fitting']} of {s['fitting'] + too_big} layouts fit device memory ({s['seconds']} s); best layout of "
        "each strategy:")
    m = req["model"]
    if m["shape_inferred"]:     # the count planned and run is the shape's, not the one asked for
        say(f"model: {m['layers']} layers x hidden {m['hidden']}, {m['heads']} heads, vocab {m['vocab']}, seq "
            f"{m['seq_len']}: {m['n_params']:,} parameters exactly (the GPT scalelab-train builds; the shape "
            f"guessed for --params {fmt_count(m['params_asked'] or m['n_params'])})")
    if doc["ranking"]:
        say(text_table(*ranking_rows(doc)))
        if len(doc["request"]["global_batches"]) > 1:
            say(BATCH_CAVEAT)
    # a strategy with no layout at all (tp at vocab 50257) was missing from the table without a word
    by_reason: dict[str, list[str]] = {}
    for name, why in s.get("excluded", {}).items():
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        say(f"not searched: {', '.join(names)}: {why}")
    # searched, but no layout fits (ddp at 7B on 80 GB devices): left out of the table without a word
    unsplit = s.get("batch_unsplit") or {}
    at_batch: dict[str, list[str]] = {}   # never built: the batch, not memory (it said memory), one line per why
    for name, least in s.get("fits_nowhere", {}).items():
        if least is None and name in unsplit:
            at_batch.setdefault(unsplit[name], []).append(name)
    for why, names in at_batch.items():
        say(f"no layout at this batch: {', '.join(names)}: {why}")
    for name, least in s.get("fits_nowhere", {}).items():
        if least is None and name in unsplit:
            continue
        say(f"fits nowhere: {name}: " + (f"its smallest layout needs {fmt_bytes(least)} per device"
                                         if least else "no layout fits the node's host memory or the planner "
                                         "refused each (recommendation.json search.pruned says which)")
            + (f"; and {unsplit[name]}" if name in unsplit else ""))
    for note in ((doc.get("tie") or {}).get("note"), (doc.get("budget") or {}).get("note")):
        if note:
            say(note)
    for r in doc["rejected_by_trainer"]:
        say(f"refused by the trainer: {r['layout']}: {r['error']}")


def _batch_unsplit(req: Request, cands, unsplit: dict, excluded: dict) -> dict:
    """{strategy: why in words} of each strategy searched with no layout in the ranking whose
    layouts the global batch did not divide (6 devices, batch 16: ddp, fsdp and ZeRO "fit nowhere",
    said as a memory problem, and a pipeline was recommended at 2/3 of ddp's speed at batch 24),
    with the nearest global batches its data-parallel degrees divide."""
    fitting = {c.strategy for c in cands}
    out = {}
    for name, pairs in unsplit.items():
        if name in fitting or name in excluded:
            continue
        batches = sorted({gb for gb, _ in pairs})
        dps = sorted({dp for _, dp in pairs})
        # the three multiples of a dp nearest the asked batches, in increasing order
        near = sorted(sorted({x for gb, dp in pairs for x in (gb // dp * dp, (gb // dp + 1) * dp) if x > 0},
                             key=lambda x: (min(abs(x - gb) for gb in batches), x))[:3])
        said = f"{', '.join(map(str, near[:-1]))} or {near[-1]}" if len(near) > 1 else str(near[0])
        out[name] = (f"global batch {', '.join(map(str, batches))} does not split over its "
                     f"{', '.join(map(str, dps))} data-parallel ranks; --global-batch {said} would")
    return out


def _fits_nowhere(req: Request, cands, smallest: dict, excluded: dict) -> dict:
    """{strategy: its least device memory of a layout too big (None: none was built)} of each
    strategy searched (not EXCLUDED: unrunnable) that has no layout that fits."""
    fitting = {c.strategy for c in cands}
    return {n: smallest.get(n) for n in req.strategies if n not in fitting and n not in excluded}


def _finish(doc: dict, out: Path, records, summaries, say) -> None:
    paths = write_all(doc, out, records, summaries)
    doc["files"] = {k: str(v) for k, v in paths.items()}
    write_all(doc, out, records, summaries)   # again, so the json lists the files too
    lr = doc.get("lr") or {}
    if lr.get("advice"):
        a = lr["advice"]
        caveat = f"; caveat: {a['caveat']}" if a.get("caveat") else ""
        say(f"\nLR: rule {a['rule']}, lr {a['lr']:.4g} (base {a['base_lr']:g} at batch {a['base_batch']}{caveat}), "
            f"warmup {a['warmup_steps']}: {a['why']}")
    if lr.get("check"):
        c = lr["check"]
        say(f"LR check ({c['steps']} steps, {c['wall_s']:.0f} s): lowest training loss over the last quarter with "
            f"{c['varied']}={c['best']}"
            + ("" if c["agrees_with_advice"] else f" (not the advice: {_why_not_advice(c, lr['advice'])}; "
               "the command keeps the advice)")
            + (f"; diverged (NaN/inf loss, not picked): {', '.join(map(str, c['diverged']))}"
               if c.get("diverged") else ""))
        say(text_table(*lr_table(doc)))
    for k, p in doc["files"].items():
        say(f"{k}: {p}")
    if doc.get("winner"):
        w = doc["winner"]
        measured = f", measured {fmt_score(doc['objective'], w['measured_score'])}" if w["measured_score"] else ""
        say(f"\nrecommended ({w['source']}; predicted {fmt_score(doc['objective'], w['predicted_score'])}{measured}):"
            f"\n{w['command']}")


def _why_not_advice(check: dict, advice: dict) -> str:
    """Why a short LR check's lowest loss need not overrule the advice, for the way it differs."""
    if check.get("best") is None:
        if check.get("diverged"):
            return (f"no LR-check run completed without diverging ({check['varied']}="
                    f"{', '.join(map(str, check['diverged']))} diverged: NaN/inf loss)")
        return "no LR-check run completed (lr_check.log has why)"
    if check["varied"] == "lr_scaling":
        return f"a {check['steps']}-step loss is noisy; --lr-steps longer would tell the rules apart"
    try:
        higher = float(check["best"]) > float(advice["base_lr"])
    except (TypeError, ValueError):
        higher = None
    if higher:
        return ("a short run favours large LRs, which fall fastest early and may diverge later; "
                f"--lr-steps longer than {check['steps']} would tell")
    return f"lower than advised; a {check['steps']}-step loss is noisy: --lr-steps longer would tell"


def _measured(doc: dict, winner: dict):
    v = doc.get("verification")
    if not v:
        return None
    i = doc["ranking"].index(winner)
    rows = [r for r in v["ranking"] if r["planner_rank"] == i + 1]
    return rows[0].get("measured_score") if rows else None
