"""The field types of the config schema (scalelab.schema): a key's type, its range or choices,
and the one line that says what is valid."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    """kind: int | float | bool | str | list | any. lo/hi: range (lo_open/hi_open: strict).
    choices: the valid values (compared as given; `fold`: case-insensitive). null: None is valid.
    also: extra literal values that are valid whatever the kind (e.g. "auto"). item: the Field of
    each list element. length: a list's exact length. rule: what is valid, as the error says it
    (default: built from the above). desc: what the key means (appended in parentheses)."""

    kind: str
    desc: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple | None = None
    null: bool = False
    also: tuple = ()
    item: "Field | None" = None
    length: int | None = None
    fold: bool = False
    rule: str | None = None

    def what(self) -> str:
        """What is valid, in words ("must be an integer >= 1", "is not valid: choose one of a, b")."""
        if self.rule:
            return self.rule
        listed = set(map(str, self.choices or ()))
        extra = [*(["null"] if self.null else []), *(str(a) for a in self.also if str(a) not in listed)]
        if self.choices is not None:
            return "is not valid: choose one of " + ", ".join([*map(str, self.choices), *extra])
        noun = {"int": "an integer", "float": "a number", "bool": "a boolean (true or false)",
                "str": "a non-empty string", "list": "a list", "any": "a value"}[self.kind]
        rng = []
        if self.lo is not None:
            rng.append(f"{'>' if self.lo_open else '>='} {_num(self.lo)}")
        if self.hi is not None:
            rng.append(f"{'<' if self.hi_open else '<='} {_num(self.hi)}")
        if self.lo is not None and self.hi is not None:
            text = f"{noun} in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
        else:
            text = " ".join([noun, *rng])
        if self.kind == "list" and self.item is not None:
            text = (f"a list of {self.length} " if self.length else "a list of ") + _plural(self.item)
        return "must be " + text + (f" or {' or '.join(extra)}" if extra else "")

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.null
        if any(v == a and type(v) is type(a) for a in self.also):
            return True
        if self.choices is not None:
            if isinstance(v, bool) and not any(isinstance(c, bool) for c in self.choices):
                return False  # a boolean is never one of the words / numbers
            if self.fold and isinstance(v, str):
                return v.lower() in [str(c).lower() for c in self.choices]
            return any(v == c and type(v) is type(c) for c in self.choices)
        if self.kind == "bool":
            return isinstance(v, bool)
        if self.kind == "str":
            return isinstance(v, str) and v != ""
        if self.kind == "list":
            if not isinstance(v, (list, tuple)) or (self.length is not None and len(v) != self.length):
                return False
            return self.item is None or all(self.item.ok(x) for x in v)
        if self.kind == "any":
            return True
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.kind == "int" and not isinstance(v, int):
            return False
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _plural(f: Field) -> str:
    return f.what().removeprefix("must be ").replace("an integer", "integers").replace("a number", "numbers") \
        .replace("a non-empty string", "non-empty strings").replace("a boolean", "booleans")


def Int(desc: str = "", lo: int | None = None, hi: int | None = None, **kw: Any) -> Field:
    return Field("int", desc, lo=lo, hi=hi, **kw)


def Float(desc: str = "", lo: float | None = None, hi: float | None = None, **kw: Any) -> Field:
    return Field("float", desc, lo=lo, hi=hi, **kw)


def Bool(desc: str = "", **kw: Any) -> Field:
    return Field("bool", desc, **kw)


def Str(desc: str = "", **kw: Any) -> Field:
    return Field("str", desc, **kw)


def Choice(choices, desc: str = "", **kw: Any) -> Field:
    return Field("any", desc, choices=tuple(choices), **kw)
