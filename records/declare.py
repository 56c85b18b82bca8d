"""Settings declared once. A setting is a field of a frozen dataclass made with `setting()`:
its default, help text, flag and check travel with it, and everything else is derived from
the declaration: command-line options, validation whose errors name the flag, the flat
name -> value form used in JSON and GetStats, the option tables in docs/options.md, and the web
UI's form (its plain label, and when the setting applies at all).

Groups of settings are dataclasses nested in a top-level one. They organise the code and
the help; everywhere else settings are flat, by field name, so names are unique across
groups (checked when a flat form is built).

Values arrive typed (code) or as text (a web form, a GetStats map, a config file); a
group casts each to its declared type when built, so both kinds build the same settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Any

from records.checks import Check

# A registry the running program owns: the names it knows, or a function that raises
# ValueError (with a message saying what to change) for a value it cannot use.
Registry = Collection[str] | Callable[[str], object]


class SettingsError(ValueError):
    """A setting's value cannot be used; the message starts with the flag that set it."""


@dataclass(frozen=True)
class Names:
    """Choices named by a registry of the program that runs with the settings (its batching
    policies, say): the program hands its registries to `add_arguments` and `check_names`."""

    registry: str


@dataclass(frozen=True)
class Spec:
    """What a setting declares beside its default (setting() takes these by name)."""

    help: str
    flag: str = ""  # without the leading dashes; "" = the field's name with dashes
    # False: the flag belongs to another program (Locust's --host) and is not added here
    option: bool = True
    choices: tuple[str, ...] | Names | None = None
    check: Check | None = None
    # runs whose values differ measure different things (the comparison warns)
    compared: bool = True
    secret: bool = False  # an API key or the like: masked wherever the settings are written down
    label: str = ""  # a few plain words for a form; "" = the flag
    # The setting applies only where each named setting holds one of its values (or, GIVEN,
    # any value but its empty one); the form hides it otherwise, reports leave it out; () =
    # always.
    when: tuple[tuple[str, tuple | Given], ...] = ()


class Given:
    """`when`'s condition that a setting is given: any value but an empty one (a trace's
    options apply only with a trace)."""

    def __contains__(self, value) -> bool:
        return bool(value)

    def __repr__(self) -> str:
        return "GIVEN"


GIVEN = Given()


def setting(default, help: str, *, when: Mapping[str, Any] | None = None, **spec):
    """A settings field: `default` as the dataclass default, the rest as its metadata (spec:
    Spec's other fields, by name). A setting of type tuple[str, ...] is a repeatable flag
    (`--header A --header B`). when: other settings by name -> the value, or a tuple of the
    values, under which this one applies (or GIVEN: any value but an empty one)."""
    conditions = tuple((name, allowed if isinstance(allowed, tuple | Given) else (allowed,))
                       for name, allowed in (when or {}).items())
    return dataclasses.field(default=default,
                             metadata={"spec": Spec(help, when=conditions, **spec)})


def group(kind: type):
    """A field holding a nested group of settings."""
    return dataclasses.field(default_factory=kind)


def require(ok: bool, flag: str, message: str) -> None:
    """For checks across settings, in a group's __post_init__."""
    if not ok:
        raise SettingsError(f"--{flag}: {message}")


# --- groups ---

class Settings:
    """Base of every settings group: casts each field to its declared type and checks it."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            spec = f.metadata.get("spec")
            if spec is None:
                continue
            value = getattr(self, f.name)
            try:
                value = cast(hints[f.name], value)
            except ValueError as e:
                raise SettingsError(f"--{flag_of(f.name, spec)}: {e}") from None
            object.__setattr__(self, f.name, value)
            problem = (_choice_problem(spec.choices, value) if isinstance(spec.choices, tuple)
                       else None)
            problem = problem or (spec.check(value) if spec.check else None)
            if problem:
                raise SettingsError(f"--{flag_of(f.name, spec)}: {problem}")


@dataclass(frozen=True)
class Leaf:
    """One setting of a (nested) settings class."""

    name: str
    kind: Any  # the declared type
    default: Any
    spec: Spec
    group: type  # the group class declaring it

    @property
    def flag(self) -> str:
        return flag_of(self.name, self.spec)

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")

    @property
    def label(self) -> str:
        return self.spec.label or self.flag


def flag_of(name: str, spec: Spec) -> str:
    return spec.flag or name.replace("_", "-")


def leaves(cls: type) -> Iterator[Leaf]:
    """Every setting of cls and its nested groups, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "spec" in f.metadata:
            yield Leaf(f.name, hints[f.name], f.default, f.metadata["spec"], cls)
        elif dataclasses.is_dataclass(hints[f.name]):
            yield from leaves(hints[f.name])


MASK = "<set>"  # what a written-down secret reads


def flat(settings, *, reveal: bool = True) -> dict[str, Any]:
    """name -> value of every setting; reveal=False masks the secrets that are set."""
    out = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if "spec" not in f.metadata:
            out |= flat(value, reveal=reveal)
        elif f.metadata["spec"].secret and value and not reveal:
            out[f.name] = MASK
        else:
            out[f.name] = value
    return out


def build(cls: type, values: Mapping[str, Any]):
    """cls from a flat name -> value mapping (typed or text); absent names take their defaults.
    An unknown name is an error, so a misspelt key is not silently ignored."""
    unknown = set(values) - {leaf.name for leaf in leaves(cls)}
    if unknown:
        raise SettingsError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    return _build(cls, values)


def _build(cls: type, values: Mapping[str, Any]):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if "spec" in f.metadata:
            if f.name in values:
                kwargs[f.name] = values[f.name]
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], values)
    return cls(**kwargs)


def check_names(settings, registries: Mapping[str, Registry]) -> None:
    """Every setting whose choices a registry names holds a value the registry knows (or is
    unset, None, for the program to resolve)."""
    values = flat(settings)
    for leaf in leaves(type(settings)):
        if isinstance(leaf.spec.choices, Names) and values[leaf.name] is not None:
            registry = registries[leaf.spec.choices.registry]
            if callable(registry):
                try:
                    registry(values[leaf.name])
                except ValueError as e:
                    raise SettingsError(f"--{leaf.flag}: {e}") from None
            elif problem := _choice_problem(tuple(registry), values[leaf.name]):
                raise SettingsError(f"--{leaf.flag}: {problem}")


def applies(leaf: Leaf, settings) -> bool:
    """Whether the setting matters under these settings (its `when`)."""
    values = flat(settings)
    return all(values[name] in allowed for name, allowed in leaf.spec.when)


def named(cls: type, *names: str) -> tuple[str, ...]:
    """names, each checked to be one of cls's settings: a misspelt one fails at import."""
    if unknown := set(names) - {leaf.name for leaf in leaves(cls)}:
        raise ValueError(f"not settings of {cls.__name__}: {', '.join(sorted(unknown))}")
    return names


def compared_names(cls: type) -> list[str]:
    """The settings whose values must match for two runs to measure the same thing."""
    return [leaf.name for leaf in leaves(cls) if leaf.spec.compared]


# --- text forms ---

def text(value) -> str:
    """A value as one line of text that `cast` reads back: '' for None, true/false for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "\n".join(value)
    return repr(value) if isinstance(value, float) else str(value)


def cast(kind, value):
    """value as the declared type; text is parsed. ValueError says what was expected."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, UnionType) and type(None) in args:
        if value is None or value == "":
            return None
        (kind,) = [a for a in args if a is not type(None)]
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, bool):
            return value
        raise ValueError(f"expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer, got {value!r}") from None
    if kind is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {value!r}") from None
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"expected text, got {value!r}")
        return value
    if kind == tuple[str, ...]:
        # text: one value a line (a web form, a GetStats map); JSON: a list
        items = value.splitlines() if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise ValueError(f"expected a list of text, got {value!r}")
        return tuple(v for v in items if v.strip())
    raise TypeError(f"settings of type {kind} are not supported")


def _choice_problem(choices: tuple[str, ...], value) -> str | None:
    return None if value in choices else f"unknown {value!r}; choose from {', '.join(choices)}"


# --- command lines ---

def add_arguments(parser, cls: type, registries: Mapping[str, Registry] | None = None, *,
                  locust: bool = False) -> None:
    """An option per setting, in a help section per group (titled by its docstring's first
    line). Locust's parser wants every option on the parser itself (its web UI lists only
    those), and masks secrets in its web UI. Choices named by a registry are listed in the
    help, and checked by `check_names` (so every bad value gets the same kind of message)."""
    sections: dict[type, Any] = {}
    for leaf in leaves(cls):
        if not leaf.spec.option:
            continue
        if not locust and leaf.group not in sections:
            sections[leaf.group] = parser.add_argument_group(group_title(leaf.group))
        target = parser if locust else sections[leaf.group]
        extra = {"is_secret": leaf.spec.secret} if locust else {}
        target.add_argument(f"--{leaf.flag}", dest=leaf.dest, default=option_default(leaf),
                            help=help_text(leaf, registries), **_argparse_type(leaf), **extra)


def option_default(leaf: Leaf):
    """The setting's default as its parsed option holds it (append's list starts empty: None)."""
    return None if leaf.kind == tuple[str, ...] else leaf.default


def argv_of(settings) -> list[str]:
    """The command line that gives these settings (the program's own flags only)."""
    values = flat(settings)
    out = []
    for leaf in leaves(type(settings)):
        value = values[leaf.name]
        if not leaf.spec.option or value is None:
            continue
        if isinstance(value, bool):
            out.append(f"--{leaf.flag}" if value else f"--no-{leaf.flag}")
        elif isinstance(value, tuple):
            out += [part for v in value for part in (f"--{leaf.flag}", v)]
        else:
            out += [f"--{leaf.flag}", text(value)]
    return out


def from_options(cls: type, options: argparse.Namespace | Any, **given):
    """cls from parsed options (values may be text, as a web form sends them), plus the
    settings given here by name (those whose flag belongs to another program)."""
    values = {leaf.name: getattr(options, leaf.dest) for leaf in leaves(cls)
              if leaf.spec.option and getattr(options, leaf.dest, None) is not None}
    return build(cls, values | given)


def help_text(leaf: Leaf, registries: Mapping[str, Registry] | None = None) -> str:
    choices = leaf.spec.choices
    if isinstance(choices, Names) and registries and not callable(registries.get(choices.registry)):
        names = ", ".join(registries[choices.registry])
        return f"{leaf.spec.help}: {names}{_default_note(leaf)}"
    return f"{leaf.spec.help}{_default_note(leaf)}"


def _default_note(leaf: Leaf) -> str:
    return "" if leaf.default in (None, "", ()) else f" (default {text(leaf.default)})"


def _argparse_type(leaf: Leaf) -> dict:
    kind = leaf.kind
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, UnionType):
        (kind,) = args
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if kind == tuple[str, ...]:
        return {"action": "append"}
    out = {"type": kind}
    if isinstance(leaf.spec.choices, tuple):
        out["choices"] = leaf.spec.choices
    return out


def group_title(cls: type) -> str:
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")


# --- docs ---

def markdown_tables(cls: type, registries: Mapping[str, Registry] | None = None, *,
                    grouped: bool = True) -> str:
    """docs/options.md's option tables: one per group (or one for all), flag, default, meaning."""
    tables: dict[str, list[str]] = {}
    for leaf in leaves(cls):
        title = group_title(leaf.group) if grouped else ""
        rows = tables.setdefault(title, ["| flag | default | meaning |", "| --- | --- | --- |"])
        default = "" if leaf.default in (None, "") else f"`{text(leaf.default)}`"
        meaning = leaf.spec.help
        if isinstance(leaf.spec.choices, tuple):
            meaning += ": " + ", ".join(f"`{c}`" for c in leaf.spec.choices)
        elif isinstance(leaf.spec.choices, Names) and registries and not callable(
                registries.get(leaf.spec.choices.registry)):
            meaning += ": " + ", ".join(f"`{c}`" for c in registries[leaf.spec.choices.registry])
        is_bool = bool in (leaf.kind, *typing.get_args(leaf.kind))
        flag = f"`--[no-]{leaf.flag}`" if is_bool else f"`--{leaf.flag}`"
        if leaf.kind == tuple[str, ...]:
            flag += " (repeatable)"
        rows.append(f"| {flag} | {default} | {meaning} |")
    return "\n\n".join((f"{title}:\n\n" if title else "") + "\n".join(rows)
                       for title, rows in tables.items())
