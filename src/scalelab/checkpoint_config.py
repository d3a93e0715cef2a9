"""The run config each checkpoint carries, read without loading it.

Every checkpoint a scalelab run saves holds its resolved config under KEY, beside Lightning's own
entries (LitModule.on_save_checkpoint): in the .ckpt file's pickle, in a sharded checkpoint's
meta.pt (FSDP, tensor and pipeline parallel), in DeepSpeed's client state. A checkpoint copied away
from its job folder (a colleague's .ckpt given as checkpoint.resume_from) is then checked before any
rank starts as one in its folder is (resume_checks), where before another model's checkpoint got as
far as a load traceback in every rank, after the queue wait.

Read on a login node too: only the pickle's small index is read (not a tensor), by an unpickler that
builds plain containers and turns every other class into an inert placeholder, so a file given on
the command line runs no code of its own and no torch import is needed.
"""
from __future__ import annotations

import collections
import functools
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

KEY = "scalelab_config"
# a checkpoint's index is KBs to a few MB (one entry per tensor); torch stores it uncompressed, so a
# larger or compressed one is not one of ours (a small deflated member can claim gigabytes)
_PICKLE_LIMIT = 16 << 20
# Everything a class name in the pickle becomes: a plain container where a checkpoint's entries need
# one (Lightning's state_dict), built without its arguments; anything else an inert _Opaque. No
# callable that copies or grows its argument (tuple, list, codecs.encode's hex_codec: a few hundred
# bytes of pickle asking for gigabytes): what it builds is a small multiple of the pickle's size.
_PLAIN: dict[tuple[str, str], Any] = {("collections", "OrderedDict"): lambda *args, **kwargs: collections.OrderedDict()}


class _Opaque:
    """Whatever else the pickle names (a tensor, a Lightning class): accepts everything, holds nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "_Opaque":
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _PLAIN.get((module, name)) or _Opaque

    def persistent_load(self, pid: Any) -> None:   # a tensor's storage: not read
        return None


def _index(archive: Path) -> dict | None:
    """The top-level dict torch.save pickled into zip file `archive` (its data.pkl), tensors as
    placeholders; None where it is no such file."""
    try:
        with zipfile.ZipFile(archive) as z:
            names = [i for i in z.infolist() if i.filename.count("/") == 1 and i.filename.endswith("/data.pkl")]
            if len(names) != 1 or names[0].file_size > _PICKLE_LIMIT or names[0].compress_type != zipfile.ZIP_STORED:
                return None
            data = z.read(names[0])
        out = _Unpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - not a checkpoint we can read: no config from it
        return None
    return out if isinstance(out, dict) else None


def saved_entries(ckpt: Path) -> dict | None:
    """A checkpoint's entries other than its tensors (step, config, loops' state), or None: a .ckpt
    file's, a pipeline's or Lightning's sharded folder's meta.pt, DeepSpeed's model-states file (rank 0's).
    Read the checkpoint's index once while the file stays as it is (resume_checks asks up to four
    times; for a zip of many members each read parses its whole directory). Read-only: shared."""
    ckpt = Path(ckpt)
    if ckpt.is_file():
        return _index_once(ckpt)
    if (ckpt / "meta.pt").is_file():
        return _index_once(ckpt / "meta.pt")
    try:
        tag = (ckpt / "latest").read_text().strip()
    except OSError:
        return None
    if tag in ("", ".", "..") or "/" in tag:   # a tag naming another folder is not followed
        return None
    # ZeRO-1/2 write the model states once; ZeRO-3 one file per rank (rank 0's has the same entries)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (ckpt / tag / name).is_file():
            return _index_once(ckpt / tag / name)
    return None


def _index_once(archive: Path) -> dict | None:
    try:
        st = archive.stat()
    except OSError:
        return None
    return _index_cached(str(archive.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _index_cached(archive: str, mtime_ns: int, size: int) -> dict | None:
    return _index(Path(archive))


def saved_config(ckpt: Path) -> dict | None:
    """The resolved config of the run that saved checkpoint `ckpt`, as it carries it; None when
    it carries none (saved before scalelab kept it there, or by another program)."""
    cfg = (saved_entries(ckpt) or {}).get(KEY)
    try:   # plain values only, as the run wrote them (a crafted file's loops or placeholders: none)
        return json.loads(json.dumps(cfg)) if isinstance(cfg, dict) else None
    except (TypeError, ValueError, RecursionError):
        return None


def saved_step(ckpt: Path) -> int | None:
    """The optimizer step checkpoint `ckpt` was saved at, as its entries say (Lightning's global_step)."""
    step = (saved_entries(ckpt) or {}).get("global_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
