"""The run record (`run.json`, one per job; contract in shared/DESIGN.md)."""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
REDACTED = "<redacted>"
# A key that names a secret: api_key, *token (not tokens_per_s, tokenizer), secret, password, ...
_SECRET = re.compile(r"(api[_-]?key|access[_-]?key|private[_-]?key|token(?![a-z])|secret|password|passwd|"
                     r"credential|auth(?![a-z]))", re.I)
# KEY=VALUE inside a string (a Hydra override `+logger.api_key=XYZ`, an env line) whose KEY names a secret;
# KEY:VALUE in a Hydra list or dict literal, its first key too (`+hydra.job.env_set={WANDB_API_KEY:...}`)
_SECRET_ASSIGN = re.compile(r"((?:^|(?<=[\s'\"\[{,(]))[+~]*[\w.-]*?(?:api[_-]?key|access[_-]?key|private[_-]?key|"
                            r"token(?![a-z])|secret|password|passwd|credential|auth(?![a-z]))[\w.-]*\s*[=:]\s*)"
                            r"(?!<redacted>)(\"[^\"]*\"|'[^']*'|[^\s,'\"\]})]+)", re.I)
# Values that are secrets wherever they appear: set from the environment (WANDB_API_KEY, *_TOKEN, ...)
# and from secret-named overrides of this command (register_secrets).
_KNOWN: set[str] = set()
_MIN_SECRET_LEN = 4  # shorter values ("1", "on") would redact ordinary text
_MIN_ENV_SECRET_LEN = 8  # an env flag named like a secret (..._TOKEN=true) is not one


def is_secret_key(key: Any) -> bool:
    return bool(_SECRET.search(str(key)))


def register_secrets(values) -> None:
    """Values to redact wherever they appear in saved files and logs of this process."""
    _KNOWN.update(str(v) for v in values if v is not None and len(str(v)) >= _MIN_SECRET_LEN)


def secret_values() -> set[str]:
    """The secret values known now: registered ones and the values of secret-named env variables."""
    env = {v for k, v in os.environ.items() if is_secret_key(k) and len(v) >= _MIN_ENV_SECRET_LEN}
    return _KNOWN | env


# `wandb login KEY` (W&B's API keys are 40 hex digits, 86 characters on some servers): a key given
# as the command's argument, which no KEY=VALUE pattern sees
# (quoted or not; an on-prem server's keys carry a prefix: local-<40+>)
_LOGIN_KEY = re.compile(r"\bwandb\s+login\b[^\n;&|]*?\s[\"']?((?:\w+-)?\w{40,})(?=[\"']?(?:\s|$|[;&|]))", re.I)

# `--token VALUE` / `--api-key VALUE` (a CLI's secret flag, space-separated: `huggingface-cli login
# --token hf_...` passed every KEY=VALUE check and went into the job script); and tokens that say
# what they are by their prefix wherever they stand (Hugging Face, GitHub, OpenAI-style, Slack)
_FLAG_SECRET = re.compile(r"((?:^|(?<=\s))--?[\w-]*?(?:api[_-]?key|access[_-]?key|private[_-]?key|token(?![a-z])|"
                          r"secret|password|passwd|credential)[\w-]*(?<![-_]file)(?<![-_]path)(?<![-_]dir)\s+)"
                          r"(?!<redacted>)(?!-)(\"[^\"]*\"|'[^']*'|\S+)", re.I)
_PREFIXED = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|ghp_[A-Za-z0-9]{20,}|github_pat_\w{20,}|sk-[A-Za-z0-9_-]{20,}|"
                       r"xox[abprs]-[\w-]{10,})")


def redact_text(text: str) -> str:
    """`text` with every known secret value and every secret-named KEY=VALUE's value replaced."""
    if not isinstance(text, str) or not text:
        return text
    for v in sorted(secret_values(), key=len, reverse=True):
        if v in text:
            text = text.replace(v, REDACTED)
    text = _LOGIN_KEY.sub(lambda m: m.group(0).replace(m.group(1), REDACTED), text)
    text = _PREFIXED.sub(REDACTED, text)
    text = _FLAG_SECRET.sub(lambda m: m.group(1) + (m.group(2) if m.group(2).strip("\"'").startswith("$")
                                                   else REDACTED), text)
    return _SECRET_ASSIGN.sub(lambda m: m.group(1) + REDACTED, text)


def redact_argv() -> list[str]:
    """Redact this process's sys.argv in place (redact_text on each argument); returns the argv
    as it was. W&B records sys.argv[1:] in a run's metadata (its .wandb file, and its server once
    synced or online): a rank forked from the launcher has the launcher's command line, with any
    `+logger.api_key=...` as typed."""
    import sys

    before = list(sys.argv)
    sys.argv[:] = [redact_text(a) for a in before]
    return before


def literal_secret(text: str) -> bool:
    """Whether `text` (a shell line) holds a secret as written: a known secret value, a
    secret-named KEY=VALUE whose value is not a reference the shell expands ($VAR, ${VAR}, $(...)),
    or a key given to `wandb login`."""
    if any(v in text for v in secret_values()) or _LOGIN_KEY.search(text) or _PREFIXED.search(text):
        return True
    return any(not m.group(2).strip("\"'").startswith("$")
               for m in (*_SECRET_ASSIGN.finditer(text), *_FLAG_SECRET.finditer(text)))


def scrub(obj: Any) -> Any:
    """Drop values whose key looks like a secret (and known secret values inside strings, e.g. in
    the job's override list), so saved configs, records and logs never hold one."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and v is not None else scrub(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def scrub_file(path: Path) -> None:
    """Rewrite a text file (a Hydra-written .hydra/*.yaml, a log) with its secrets redacted."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return
    clean = redact_text(text)
    if clean != text:
        _replace(path, clean)


def finite(obj: Any) -> Any:
    """OBJ with every NaN and +-inf float made None: JSON has no such number (a diverged run's loss
    was written `NaN`, which jq, JSON.parse and strict parsers reject). Tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON of OBJ (finite: non-finite floats as null; allow_nan=False, so none slips
    through); what json cannot encode is written as its str()."""
    return json.dumps(finite(obj), allow_nan=False, default=str, **kwargs)


def write_json(path: Path, obj: Any) -> None:
    _replace(Path(path), dumps(obj, indent=2))  # readers never see half a file


def _replace(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`. The temporary
    name is this process's own (host and pid): two processes writing one file (the nodes of a
    launcher=torchrun job that share a folder, a Hydra file both scrub) each replaced the other's
    half-written `run.json.tmp` before (a shared name: one rename failed or moved the other's)."""
    import socket

    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# The decay each LR scaling rule's config has by default (conf/lr_scaling/{none,linear,sqrt}.yaml).
_DEFAULT_DECAY = {"none": "constant", "linear": "cosine", "sqrt": "cosine"}


def lr_rule_label(lr_scaling: dict) -> str:
    """The LR rule a record, the W&B tags and the charts group by: the scaling rule, and its decay
    where it is not the rule's usual one (lr_scaling=linear_constant -> "linear_constant"; before,
    both linear configs were recorded as "linear" and one chart series mixed them)."""
    rule, decay = lr_scaling.get("rule"), lr_scaling.get("decay")
    return str(rule) if decay is None or _DEFAULT_DECAY.get(rule) == decay else f"{rule}_{decay}"


def base_record(cfg: dict, batch, lr: float, world_size: int, plan_degrees: dict, arch: Any,
                n_params: int | None, accelerator: str, threads: int) -> dict:
    """Everything known before training: identical for completed and failed runs."""
    arch_d = {k: getattr(arch, k) for k in ("n_layers", "d_model", "n_heads", "vocab_size", "seq_len")
              if hasattr(arch, k)}
    if hasattr(arch, "mlp_ratio"):
        arch_d["ffn_hidden"] = arch.mlp_ratio * arch.d_model
    return {
        "status": None,
        "strategy": cfg["strategy"]["name"],
        "world_size": world_size,
        "num_nodes": cfg["trainer"]["num_nodes"],
        "devices_per_node": cfg["trainer"]["devices"],
        "global_batch_size": batch.global_batch_size,
        "per_device_batch_size": batch.per_device_batch_size,
        "accumulate_grad_batches": batch.accumulate_grad_batches,
        "lr_rule": lr_rule_label(cfg["lr_scaling"]),
        "lr_decay": cfg["lr_scaling"].get("decay"),
        "base_lr": cfg["optim"]["lr"],
        "base_batch_size": cfg["lr_scaling"]["base_batch_size"],
        "lr": lr,
        "steps": 0,
        "throughput": {"samples_per_s": None, "tokens_per_s": None},
        "step_time_s": {"median": None, "p90": None},
        "memory": {"peak_rss_bytes_per_rank": [], "model_state_bytes_per_rank": []},
        "loss": {"first": None, "final": None, "curve": []},
        "precision": str(cfg["trainer"]["precision"]),
        "optimizer": cfg["optim"]["name"],
        "model": {"name": cfg["model"]["name"], "kind": "gpt" if cfg["model"]["task"] == "lm" else "mlp",
                  "n_params": n_params, **arch_d},
        "parallel": plan_degrees,
        "activation_checkpointing": getattr(arch, "activation_checkpointing", "none"),
        "hardware": {"accelerator": accelerator, "threads_per_rank": threads},
        "seed": cfg["seed"],
        "max_steps": cfg["trainer"]["max_steps"],
        "job": scrub({k: v for k, v in cfg.get("job", {}).items()}),
        "config": scrub({k: v for k, v in cfg.items() if k != "job"}),
    }


def max_of(values) -> int | float | None:
    """The largest of the per-rank values a record holds (None entries skipped); None if none."""
    return max((v for v in values or [] if v is not None), default=None)


def num_nodes(rec: dict) -> int:
    """The nodes a run spanned: run.json num_nodes, else its config's trainer.num_nodes, else 1 (a
    record from before num_nodes was written ran on one node)."""
    n = rec.get("num_nodes")
    if n is None:
        n = ((rec.get("config") or {}).get("trainer") or {}).get("num_nodes")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


class BadRecord(ValueError):
    """A run.json that cannot be used: not JSON, not an object, or missing / mistyped keys."""


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is(v: Any, kind: str) -> bool:
    return {"num": _num(v), "num?": v is None or _num(v), "int>=1": isinstance(v, int) and not isinstance(v, bool)
            and v >= 1, "int?": v is None or (isinstance(v, int) and not isinstance(v, bool)),
            "str": isinstance(v, str) and v != "", "dict": isinstance(v, dict), "dict?": v is None or isinstance(v, dict),
            "list": isinstance(v, list), "nums": isinstance(v, list) and all(_num(x) for x in v)}[kind]


_KIND_WORDS = {"num": "a number", "num?": "a number or null", "int>=1": "an integer >= 1", "int?": "an integer or null",
               "str": "a string", "dict": "an object", "dict?": "an object or null", "list": "a list",
               "nums": "a list of numbers"}
# What compare and aggregation read (shared/DESIGN.md run record contract): (key, kind, required).
# Nested keys are checked when their parent is there; optional keys only when present.
_SHAPE = (
    ("status", "str", True), ("strategy", "str", True), ("world_size", "int>=1", True),
    ("global_batch_size", "int>=1", True), ("throughput", "dict", True),
    ("throughput.samples_per_s", "num?", False), ("throughput.tokens_per_s", "num?", False),
    ("per_device_batch_size", "int?", False), ("accumulate_grad_batches", "int?", False), ("lr", "num?", False),
    ("step_time_s", "dict", False), ("step_time_s.median", "num?", False), ("step_time_s.p90", "num?", False),
    ("memory", "dict", False), ("memory.peak_rss_bytes_per_rank", "nums", False),
    ("memory.model_state_bytes_per_rank", "nums", False),
    ("loss", "dict", False), ("loss.first", "num?", False), ("loss.final", "num?", False), ("loss.curve", "list", False),
    ("mfu", "dict?", False), ("mfu.value", "num?", False), ("breakdown", "dict?", False),
    ("breakdown.comm_fraction", "num?", False), ("parallel", "dict", False), ("parallel.dp", "int>=1", False),
    ("job", "dict", False), ("config", "dict?", False),
)


def record_problem(rec: Any) -> str | None:
    """Why `rec` (a parsed run.json) cannot be compared or aggregated; None when it can."""
    if not isinstance(rec, dict):
        return f"not a run record: a JSON {type(rec).__name__.replace('dict', 'object')}, not an object"
    for key, kind, required in _SHAPE:
        node: Any = rec
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if leaf not in node:
            if required:
                return f"missing key {key!r}"
            continue
        if not _is(node[leaf], kind):
            return f"{key}={json.dumps(node[leaf], default=str)[:60]} is not {_KIND_WORDS[kind]}"
    return None


def completed_final(record: dict | None) -> bool:
    """Whether `record` is a completed run's final record: the launcher's, which adds its
    `ranks_exited` mark to rank 0's (rank 0's part alone may be all that is left of a job killed
    after it; SLURM requeues and reruns keep only final ones)."""
    if not record or record.get("status") != "completed":
        return False
    return bool(((record.get("timing") or {}).get("marks") or {}).get("ranks_exited"))


def load_record(path: Path | str) -> dict:
    """One run.json, checked (record_problem); BadRecord says why it cannot be used."""
    path = Path(path)
    try:
        rec = json.loads(path.read_text())
    except UnicodeDecodeError as e:
        raise BadRecord(f"not UTF-8 text ({e.reason})") from e
    except json.JSONDecodeError as e:
        raise BadRecord(f"not valid JSON (truncated or corrupt): {e.msg.removesuffix(' at')} at line {e.lineno} "
                        f"column {e.colno}") from e   # ("Invalid control character at" is json's whole msg)
    except OSError as e:
        raise BadRecord(f"cannot be read: {e.strerror or e}") from e
    problem = record_problem(rec)
    if problem:
        raise BadRecord(problem)
    return rec


def read_records(paths: list[Path | str], problems: list[str] | None = None) -> list[dict]:
    """run.json files found under each path (a run.json, a job dir or a sweep dir), each file once
    however many of the paths hold it. A file that
    cannot be used (corrupt, truncated, wrongly shaped) is skipped: "PATH: reason" goes to
    `problems` when given, else one line "skipped PATH: reason" to stderr."""
    import sys

    out, others, seen = [], [], set()
    for p in map(Path, paths):
        if p.is_file() and p.suffix != ".json":   # a glob's logs and scripts (`compare outputs/slurm/*`)
            others.append(p)
            continue
        files = [p] if p.is_file() else sorted(p.rglob(RUN_FILE))
        for f in files:
            if f.resolve() in seen:   # paths that overlap (`compare S S/0`): each record once
                continue
            seen.add(f.resolve())
            if p.is_dir() and f.parent != p and other_node_part(f):
                continue
            try:
                rec = load_record(f)
            except BadRecord as e:
                if problems is None:
                    print(f"skipped {f}: {e}", file=sys.stderr)
                else:
                    problems.append(f"{f}: {e}")
                continue
            if p.is_dir() and rec.get("record_on_node") is not None and rec.get("status") == "completed":
                # node K's placeholder of a launcher=torchrun job (no figures; the record is node 0's)
                # in a folder of its own (scalelab k8s --pvc's NAME/nodeK, a hydra.run.dir per node):
                # it was a second "completed" row of dashes
                why = f"{f}: node {rec.get('node_rank')}'s part of a multi-node job, no run of its own (its " \
                      f"record is node {rec['record_on_node']}'s)"
                if problems is None:
                    print(f"skipped {why}", file=sys.stderr)
                else:
                    problems.append(why)
                continue
            rec.setdefault("job", {})["record_path"] = str(f)
            out.append(rec)
    if others:   # one line for them all
        names = ", ".join(o.name for o in others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        why = f"{len(others)} file(s) that are not run records (not .json): {names}"
        if problems is None:
            print(f"skipped {why}", file=sys.stderr)
        else:
            problems.append(why)
    return out


def other_node_part(f: Path) -> bool:
    """Whether run.json `f` is the part of a launcher=torchrun node other than node 0 kept inside
    the job's own folder (JOB_DIR/nodeK/run.json beside node 0's JOB_DIR/run.json: scalelab.train
    puts it there when the nodes share the job's folder). It is no run of its own: found under a
    folder given to compare or to a sweep's aggregation, it is left out (the file named itself is read)."""
    import re

    if not re.fullmatch(r"node[1-9]\d*", f.parent.name) or not (f.parent.parent / RUN_FILE).is_file():
        return False
    try:
        rank = json.loads(f.read_text()).get("node_rank")
    except (OSError, ValueError, AttributeError):
        return False
    return f.parent.name == f"node{rank}"


def register_override_secrets(args: list[str]) -> None:
    """Register the values of this command line's secret-named overrides (`+logger.api_key=XYZ`),
    so they are redacted wherever they reappear (an interpolation, a log line)."""
    for a in args:
        key, sep, value = a.partition("=")
        if sep and is_secret_key(key.lstrip("+~")):
            register_secrets([value.strip("'\"")])


def install_log_redaction() -> None:
    """Redact secrets from every log record of this process (Hydra's launcher lines that list a
    job's overrides, the job's train.log), whatever handlers Hydra configures later."""
    import logging

    previous = logging.getLogRecordFactory()
    if getattr(previous, "_scalelab_redacts", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's business, not ours
            return record
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, ()
        return record

    factory._scalelab_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
