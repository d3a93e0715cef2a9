"""`scalelab`: compare runs, plan jobs, render SLURM scripts."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _compare(args: argparse.Namespace) -> int:
    from scalelab.results.callbacks import cpu_note
    from scalelab.results.record import read_records
    from scalelab.results.sweep import summaries_for
    from scalelab.results.table import SelectError, filter_records, group_records, print_rich, render, sort_records

    from scalelab.paths import out_problem, write_out

    if any(not p.strip() for p in args.paths):   # an unset shell variable ("$SWEEP"): Path("") is the cwd
        print("error: '' is an empty path (an unset variable?): give run.json files, job dirs or sweep dirs",
              file=sys.stderr)
        return 2
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(f"error: {missing[0]} does not exist (give run.json files, job dirs or sweep dirs)", file=sys.stderr)
        return 2
    if args.format == "html" and not args.out and sys.stdout.isatty():   # megabytes of HTML on the terminal
        print("error: --format html writes a file: add --out report.html", file=sys.stderr)
        return 2
    twice = next((f"--{n.replace('_', '-')} {' '.join(getattr(args, n))}" for n in ("sort", "group_by")
                  if len(getattr(args, n) or []) > 1), None)
    if twice:   # argparse kept the last one, silently (review)
        print(f"error: {twice}: give one key (it orders or groups by one key)", file=sys.stderr)
        return 2
    args.sort, args.group_by = ((v or [None])[0] for v in (args.sort, args.group_by))
    empty = next((f"--{n.replace('_', '-')}" for n in ("sort", "group_by") if getattr(args, n) == ""), None)
    if empty:   # `--sort=` was ignored silently
        print(f"error: {empty} needs a key (a dotted path into run.json, e.g. throughput.tokens_per_s)", file=sys.stderr)
        return 2
    problem = args.out and out_problem(args.out, "--out", args.paths)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    skipped: list[str] = []  # unusable run.json files: one line each, then the rest is compared
    records = read_records(args.paths, skipped)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if not records:
        print(f"error: no {'readable ' if skipped else ''}run.json under {' '.join(args.paths)}"
              + (f" ({len(skipped)} skipped)" if skipped else ""), file=sys.stderr)
        return 2
    # every sweep the runs come from, however they were named (the sweep, its parent, some of its
    # job folders): efficiency only of sweeps named directly left it out of the others
    summaries = summaries_for(records, args.paths)
    from scalelab.results.sweep import NO_RECORD_WHY

    for s in summaries:   # a killed job's folder: in no row, said once (as an unreadable record is)
        for name in s.get("no_record") or []:
            print(f"no record {Path(s['sweep_dir']) / name}: {NO_RECORD_WHY}", file=sys.stderr)
    try:
        records = filter_records(records, args.where)
        if not records:
            print(f"error: no run matches {' and '.join(args.where)}", file=sys.stderr)
            return 2
        sort_records(records, args.sort)          # check the keys before any output
        if args.group_by:
            group_records(records, args.group_by)
        # several CPU ranks on one host: the line a sweep's own table has under it (callbacks.cpu_note)
        note = cpu_note(records) if args.format == "table" else None
        if args.format == "table" and not args.out and sys.stdout.isatty():
            print_rich(records, args.group_by, args.sort)
            if note:
                print(note)
            return 0
        text = render(records, args.format, group_by=args.group_by, sort=args.sort, summaries=summaries)
        text += f"\n{note}" if note else ""
    except SelectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write_out(args.out, text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from scalelab.plan import cli as plan_cli

    def job_terms(overrides):
        from scalelab.plan_job import terms_for_job  # the training config code, only when asked

        return terms_for_job(overrides)

    return plan_cli.run(args, job_terms)


def _listed(items, n: int = 3) -> str:
    return ", ".join(map(str, items[:n])) + (f" and {len(items) - n} more" if len(items) > n else "")


def _job_folder_hint(job: Path) -> str:
    """What to aggregate instead of the job folder JOB: its record's own sweep (job.sweep_dir), or
    that it is a single run with no sweep."""
    from scalelab.results.record import BadRecord, load_record
    from scalelab.results.sweep import has_job_section

    try:
        rec = load_record(job / "run.json")
    except BadRecord:
        rec = {}
    if not has_job_section(rec) or "sweep_dir" not in rec["job"]:
        # unreadable, a very old record, or slurm_jobs.finalize's (a task that ended before its record)
        return f"give its sweep folder, e.g. {job.resolve().parent}"
    if not rec["job"].get("sweep_dir"):
        return "its run.json is of a single run, with no sweep to aggregate (scalelab compare shows it)"
    return f"give its sweep folder, {rec['job']['sweep_dir']}"


def _not_one_sweep(folder: Path, records: list[dict]) -> str | None:
    """Why FOLDER is not one sweep's folder, by what its records name (job.sweep_dir): none (single
    runs: nothing to aggregate, and pooled they got efficiencies against each other), several (a
    parent of sweeps: pooled against one baseline), or another folder (a parent of one sweep).
    None where they name FOLDER (or a folder of its name: a moved sweep; or FOLDER is a sweep's, with
    each job where the sweep had it: a renamed one, results.sweep.recorded_sweep), and where no record says
    either (very old records without a job section; slurm_jobs.finalize's records of tasks that ended
    before train.py wrote one)."""
    from scalelab.results.sweep import has_job_section, sweep_of_record

    with_job = [r for r in records if has_job_section(r)]
    if not with_job:
        return None
    named = list(dict.fromkeys(str(r["job"]["sweep_dir"]) for r in with_job if r["job"].get("sweep_dir")))
    if not named and any("sweep_dir" in r["job"] for r in with_job):   # train.py's single runs (null)
        return (f"{folder} holds single runs only (their run.json names no sweep_dir): no sweep to aggregate; "
                f"compare them with scalelab compare {folder}")
    if not named:
        return None
    if len(named) > 1:
        return f"{folder} holds runs of {len(named)} sweeps, not one: aggregate each sweep's folder ({_listed(named)})"
    if (Path(named[0]).resolve() != folder.resolve() and Path(named[0]).name != folder.resolve().name
            # a renamed sweep: FOLDER holds multirun.yaml or sweep.json, each job where the sweep had it
            and any(sweep_of_record(r) != folder.resolve() for r in with_job)):
        return f"{folder} is not its runs' sweep folder: aggregate {named[0]}"
    return None


def _aggregate(args: argparse.Namespace) -> int:
    from scalelab.results.callbacks import summarize_sweep

    if not args.sweep_dir.strip():   # an unset shell variable: Path("") is the cwd, its sweep.json rewritten
        print("error: '' is an empty path (an unset variable?): give a sweep dir, e.g. outputs/sweeps/<time>",
              file=sys.stderr)
        return 2
    sweep = Path(args.sweep_dir)
    if not sweep.exists():
        print(f"error: {sweep} does not exist (give a sweep dir, e.g. outputs/sweeps/<time>)", file=sys.stderr)
        return 2
    if sweep.is_file():
        print(f"error: {sweep} is a file, not a sweep folder: give its sweep folder (e.g. {sweep.resolve().parent.parent}"
              f"), or scalelab compare {sweep}", file=sys.stderr)
        return 2
    if not any(sweep.rglob("run.json")):
        print(f"error: {sweep} holds no run.json (give a sweep dir, e.g. outputs/sweeps/<time>)", file=sys.stderr)
        return 2
    if (sweep / "run.json").is_file():   # a job folder: its sweep.json and report.html landed beside run.json
        print(f"error: {sweep} is a job folder (it holds run.json), not a sweep folder: {_job_folder_hint(sweep)}",
              file=sys.stderr)
        return 2
    nested = sorted(p.parent for p in sweep.rglob("multirun.yaml") if p.parent != sweep)
    if nested and not any(sweep.glob("*/run.json")) and not (sweep / "multirun.yaml").exists():
        # a parent of sweeps (outputs/sweeps): pooled, the same config of two sweeps was one
        # scaling group against one baseline
        print(f"error: {sweep} holds {len(nested)} sweep(s), not one: aggregate each sweep's folder "
              f"({_listed(nested)})" if len(nested) > 1 else
              f"error: {sweep} is not a sweep folder: aggregate the sweep it holds, {nested[0]}", file=sys.stderr)
        return 2
    from scalelab.results.record import read_records

    skipped: list[str] = []
    records = read_records([sweep], skipped)
    if not records:  # only unusable run.json files: say which, and stop
        for line in skipped:
            print(f"skipped {line}", file=sys.stderr)
        print(f"error: {sweep} holds no readable run.json ({len(skipped)} skipped)", file=sys.stderr)
        return 2
    problem = _not_one_sweep(sweep, records)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # the project and entity the sweep's jobs logged to (the summary run beside them, as the sweep's own
    # aggregation put it): a re-aggregation "resumed" it into project scalelab, another run elsewhere
    logged = [((r.get("config") or {}).get("logger") or {}) for r in records]
    logger = ({"name": "wandb", "mode": args.wandb, "project": args.project or _one_value(logged, "project") or "scalelab",
               "entity": args.entity or _one_value(logged, "entity")} if args.wandb != "disabled" else None)
    summary = summarize_sweep(sweep, logger)
    if not summary["num_completed"]:   # a script told "aggregated" from "nothing to aggregate" by the exit
        print(f"error: no completed run in {sweep} ({summary['num_failed']} failed): no scaling efficiency",
              file=sys.stderr)
        return 1
    return 0


def _one_value(dicts: list[dict], key: str):
    """The value every dict that has KEY gives it; None where none or several."""
    values = {d.get(key) for d in dicts} - {None, ""}
    return values.pop() if len(values) == 1 else None


class _OneLineErrors(argparse.ArgumentParser):
    """A bad argument is one line naming it (argparse printed the whole usage first: ~20 lines)."""

    def error(self, message: str):
        if "invalid choice: 'train'" in message:   # the trainer is a command of its own
            message += "; to train: scalelab-train KEY=VALUE ..."
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from scalelab import __version__

    # training is its own command (Hydra's CLI): `scalelab --help` never said so
    parser = _OneLineErrors(prog="scalelab", description=__doc__ + "\n\nTo train (one run, or a sweep with -m): "
                            "scalelab-train KEY=VALUE ... (scalelab-train --help; the quick start is `make run`).",
                            formatter_class=argparse.RawDescriptionHelpFormatter)   # its subcommands' parsers too
    parser.add_argument("--version", action="version", version=f"scalelab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="table / dashboard of run records")
    cmp.add_argument("paths", nargs="+", help="run.json files, job dirs or sweep dirs (several: before/after)")
    cmp.add_argument("--format", choices=["table", "markdown", "json", "csv", "html"], default="table",
                     help="html: one self-contained dashboard file (charts + sortable run table)")
    cmp.add_argument("--out", help="write to this file instead of stdout")
    keys = "a dotted path into run.json (throughput.tokens_per_s, config.optim.name) or a W&B metric name"
    cmp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                     help=f"keep runs whose KEY equals VALUE (VALUE may be a,b; a float also matches as the table shows "
                          f"it (--where lr=0.00424)); repeatable. KEY: {keys}")
    cmp.add_argument("--sort", action="append", metavar="KEY", help="order by KEY (--sort=-KEY: descending)")
    cmp.add_argument("--group-by", action="append", metavar="KEY", help="one section (table) / series label (html) per value of KEY")
    cmp.set_defaults(func=_compare)
    agg = sub.add_parser("aggregate", help="(re)compute a sweep's sweep.json and summary, on demand")
    agg.add_argument("sweep_dir")
    agg.add_argument("--wandb", choices=["offline", "online", "disabled"], default="disabled",
                     help="also log the sweep-summary run to W&B")
    agg.add_argument("--project", help="W&B project (default: the one the sweep's jobs logged to, else scalelab)")
    agg.add_argument("--entity", help="W&B entity (default: the one the sweep's jobs logged to)")
    agg.set_defaults(func=_aggregate)
    from scalelab import slurm

    sl = sub.add_parser("slurm", help="render or submit an sbatch script for a run (multi-node via srun)")
    slurm.add_arguments(sl)
    sl.set_defaults(func=slurm.run)
    from scalelab import k8s

    kube = sub.add_parser("k8s", help="render a Kubeflow PyTorchJob for a multi-node run (launcher=torchrun)")
    k8s.add_arguments(kube)
    kube.set_defaults(func=k8s.run)
    from scalelab.plan import cli as plan_cli  # part of the package: a failed import is a bug, not optional

    plan = sub.add_parser("plan", help="predict memory, communication, step time and cost")
    plan_cli.add_arguments(plan)
    plan.set_defaults(func=_plan)
    from scalelab.recommend import cli as recommend_cli

    rec = sub.add_parser("recommend", help="search layouts with the planner, verify the best with short runs")
    recommend_cli.add_arguments(rec)
    rec.set_defaults(func=recommend_cli.run)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> str:
    """The unknown options alone (overrides after one are not the problem), each with the nearest
    option the command has."""
    import difflib

    options = [e.split("=", 1)[0] for e in extra if e.startswith("-")]
    if not options:
        return f"unrecognized arguments: {' '.join(extra)}"
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = {o.lstrip("-"): o for a in sub._actions for o in a.option_strings}   # dashes match anything
    said = []
    for o in options:
        near = difflib.get_close_matches(o.lstrip("-"), list(known), n=1, cutoff=0.6)
        said.append(o + (f" (did you mean {known[near[0]]}?)" if near else ""))
    return f"unrecognized option(s) for `scalelab {command}`: {', '.join(said)}"


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("slurm", "k8s") and not any(e.startswith("-") for e in extra):
        args.overrides += extra  # overrides given after the options
    elif extra:
        parser.error(_unrecognized(parser, args.command, extra))
    try:
        code = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`scalelab plan ... | head`): not an error. Point stdout at /dev/null so
        # the interpreter's final flush does not raise again (Python docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    main()
