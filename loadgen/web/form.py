"""The web UI's start form, arranged from the load settings' declarations
(records/load_settings.py): the fields a test is about first, then the rest by group, each with
its plain label and its help beneath, and hidden while the settings chosen above it make it
irrelevant (its `when`: stress-only fields outside stress mode, say).

Locust builds the form's fields from its parser's options, labelled by their names and listed
in alphabetical order, with no hook to do otherwise; loadgen/web/ui.js, which the page loads
before Locust's own script, applies what `form_spec` says.
"""

from __future__ import annotations

from loadgen.settings import REGISTRIES
from records.declare import GIVEN, group_title, help_text, leaves
from records.load_settings import (
    LoadSettings,
    Recording,
    Sender,
    Slo,
    Stress,
    TargetSettings,
    Traffic,
    Workload,
)

FIRST = ("mode", "rate", "prompt_tokens", "prompt_tokens_max", "max_tokens", "run_dir")
FIRST_TITLE = "The test"
GROUPS = (Traffic, Workload, Stress, Slo, TargetSettings, Sender, Recording)  # then, in this order
TITLE = "moe-loadlab settings"  # the form section Locust calls "Custom parameters"
GIVEN_JS = "given"  # `when`'s GIVEN in the page: the field applies where that one is not empty


def form_spec() -> dict:
    """By option name (Locust's form field): label, help, group, and `when` as option name ->
    the values under which the field applies; `order`, the fields in the order shown."""
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
    return {"title": TITLE, "order": list(fields), "fields": fields}

