"""The web UI's start form, arranged from the load settings' declarations
(records/load_settings/): the fields a test is about first, then the rest by group, folded
until asked for (a group holding a value the command line set starts open), each field with its
plain label and a line of help, and hidden while the settings chosen above it make it irrelevant
(its `when`: stress-only fields outside stress mode, say). Choices a registry names (the
server's protocol) are a choice list, as argparse's own choices are.

Locust builds the form's fields from its parser's options, labelled by their names and listed
in alphabetical order, with no hook to do otherwise; loadgen/web/ui.js, which the page loads
before Locust's own script, applies what `form_spec` says.
"""

from __future__ import annotations

import argparse

from loadgen.settings import REGISTRIES
from records.declare import GIVEN, Names, group_title, help_text, leaves, option_default
from records.load_settings import (
    LoadSettings,
    RecordingSettings,
    SenderSettings,
    SlaSettings,
    SloSettings,
    StressSettings,
    TargetSettings,
    TrafficSettings,
    WorkloadSettings,
)

FIRST = ("mode", "rate", "prompt_tokens", "prompt_tokens_max", "max_tokens", "run_dir")
FIRST_TITLE = "The test"
# then, in this order
GROUPS = (TrafficSettings, WorkloadSettings, StressSettings, SlaSettings, SloSettings,
          TargetSettings, SenderSettings, RecordingSettings)
TITLE = "moe-loadlab settings"  # the form section Locust calls "Custom parameters"
GIVEN_JS = "given"  # `when`'s GIVEN in the page: the field applies where that one is not empty


def form_spec(options: argparse.Namespace | None = None) -> dict:
    """By option name (Locust's form field): label, help, group, `when` as option name -> the
    values under which the field applies, and `choices` where a registry names them; `order`,
    the fields in the order shown; `open`, the groups shown unfolded: the test's own, and those
    holding a value `options` (the command line's) set to other than its default."""
    shown = [leaf for leaf in leaves(LoadSettings) if leaf.spec.option]
    dest = {leaf.name: leaf.dest for leaf in leaves(LoadSettings)}
    first = [leaf for name in FIRST for leaf in shown if leaf.name == name]
    rest = [leaf for group in GROUPS for leaf in shown
            if leaf.group is group and leaf.name not in FIRST]
    fields = {}
    for leaf in first + rest:
        fields[leaf.dest] = {
            "label": leaf.label, "help": help_text(leaf, REGISTRIES),
            "group": FIRST_TITLE if leaf.name in FIRST else group_title(leaf.group),
            "when": {dest[name]: GIVEN_JS if allowed is GIVEN else list(allowed)
                     for name, allowed in leaf.spec.when}}
        if isinstance(leaf.spec.choices, Names):
            registry = REGISTRIES[leaf.spec.choices.registry]
            if not callable(registry):
                fields[leaf.dest]["choices"] = list(registry)
    open_groups = [FIRST_TITLE] + [group_title(group) for group in GROUPS
                                   if options is not None and _set(options, group, shown)]
    return {"title": TITLE, "order": list(fields), "fields": fields, "open": open_groups}


def _set(options: argparse.Namespace, group: type, shown: list) -> bool:
    """Whether options set one of group's fields (not shown first) to other than its default."""
    for leaf in shown:
        if leaf.name in FIRST:
            continue
        default = option_default(leaf)
        if leaf.group is group and getattr(options, leaf.dest, default) not in (None, default):
            return True
    return False

