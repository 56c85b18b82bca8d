// moe-loadlab's additions to Locust's web UI, loaded by the page before Locust's own script
// (loadgen/web/tab.py): the start form arranged as loadgen/web/form.py says, and the chart of
// TTFT, TPOT and ITL over time under the Latency (HDR) tab's table. Locust's React app owns the
// page: this script orders the form's fields before the app reads them, then only adjusts what
// the app has drawn (label text, a line of help, which fields show) and never removes a node of
// the app's.
(function () {
  "use strict";
  const spec = window.moeWebUi;
  if (!spec) return;
  const form = spec.form;
  // Locust's app renames its options to camelCase (its form posts them back in snake_case)
  const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
  const byField = {};
  for (const name of form.order) byField[camel(name)] = name;

  // 1. Before the app reads them: the fields in our order.
  const options = window.templateArgs && window.templateArgs.extra_options;
  if (options) {
    const ordered = {};
    for (const name of form.order) if (name in options) ordered[name] = options[name];
    for (const name in options) if (!(name in ordered)) ordered[name] = options[name];
    window.templateArgs.extra_options = ordered;
  }

  const style = document.createElement("style");
  style.textContent =
    ".moe-help{font-size:12px;opacity:.7;margin:4px 2px 0;line-height:1.35}" +
    ".moe-group{font-weight:600;font-size:14px;margin:8px 0 -20px;opacity:.85}" +
    ".moe-chart{margin-top:16px;background:#fff;border-radius:4px;padding:8px}";
  document.head.appendChild(style);

  // 2. Once drawn: labels, help and groups, then which fields apply.
  function boxOf(input) {
    return input.closest(".MuiFormControl-root, .MuiFormControlLabel-root");
  }

  function relabel(box, field) {
    const checkboxText = box.querySelector(".MuiFormControlLabel-label");
    if (checkboxText) {
      checkboxText.textContent = field.label;
      const help = document.createElement("div");
      help.className = "moe-help";
      help.textContent = field.help;
      checkboxText.appendChild(help);
      return;
    }
    const label = box.querySelector("label");
    const notch = box.querySelector("legend span");  // sizes the outline's gap for the label
    if (label) label.textContent = field.label;
    if (notch) notch.textContent = field.label;
    const help = document.createElement("p");
    help.className = "moe-help";
    help.textContent = field.help;
    box.appendChild(help);
  }

  function decorate() {
    for (const input of document.querySelectorAll("input[name], select[name]")) {
      const name = byField[input.name];
      const box = name && boxOf(input);
      if (!box || box.dataset.moe) continue;
      box.dataset.moe = name;
      const field = form.fields[name];
      relabel(box, field);
      const previous = box.previousElementSibling;
      const prevName = previous && previous.dataset.moe;
      if (!prevName || form.fields[prevName].group !== field.group) {
        const header = document.createElement("div");
        header.className = "moe-group";
        header.dataset.moeGroup = field.group;
        header.textContent = field.group;
        box.before(header);
      }
      applyWhen(box.closest("form") || document);
    }
    for (const summary of document.querySelectorAll(".MuiAccordionSummary-root")) {
      const title = summary.querySelector(".MuiTypography-root");
      if (title && title.textContent === "Custom parameters") {
        title.textContent = form.title;
        if (summary.getAttribute("aria-expanded") === "false") summary.click();
      }
    }
  }

  function valueIn(root, name) {
    const input = root.querySelector(`[name="${camel(name)}"]`);
    if (!input) return undefined;
    return input.type === "checkbox" ? String(input.checked) : input.value;
  }

  function applyWhen(root) {
    const boxes = [...root.querySelectorAll("[data-moe]")];
    const shownGroups = new Set();
    for (const box of boxes) {
      const field = form.fields[box.dataset.moe];
      const applies = Object.entries(field.when).every(([name, allowed]) => {
        const value = valueIn(root, name);
        if (value === undefined) return true;
        return allowed === "given" ? value !== "" && value !== "false" : allowed.includes(value);
      });
      box.style.display = applies ? "" : "none";
      if (applies) shownGroups.add(field.group);
    }
    for (const header of root.querySelectorAll("[data-moe-group]")) {
      header.style.display = shownGroups.has(header.dataset.moeGroup) ? "" : "none";
    }
  }

  function onEdit(event) {
    const input = event.target;
    if (input && input.name && byField[input.name]) applyWhen(input.closest("form") || document);
  }

  // 3. The Latency (HDR) tab: the chart under its table, redrawn as the periods come in.
  let chart = null;
  let drawn = 0;

  function onLatencyTab() {
    return new URLSearchParams(window.location.search).get("tab") === spec.tab;
  }

  function placeChart() {
    if (!onLatencyTab()) {
      if (chart) chart.remove();
      chart = null;
      return;
    }
    const table = document.querySelector(".MuiTableContainer-root");
    if (!table) return;
    if (!chart || chart.previousElementSibling !== table) {
      if (chart) chart.remove();
      chart = document.createElement("div");
      chart.className = "moe-chart";
      chart.innerHTML = `<img alt="TTFT, TPOT and ITL over time" style="max-width:100%">`;
      table.after(chart);
      drawn = 0;
    }
    const now = Date.now();
    if (now - drawn >= spec.refresh_ms) {
      drawn = now;
      chart.querySelector("img").src = `${spec.chart}?t=${now}`;
    }
  }

  function start() {
    decorate();
    new MutationObserver(decorate).observe(document.body, {childList: true, subtree: true});
    document.addEventListener("change", onEdit, true);
    document.addEventListener("input", onEdit, true);
    window.setInterval(placeChart, 250);
  }

  if (document.body) start();
  else document.addEventListener("DOMContentLoaded", start);
})();
