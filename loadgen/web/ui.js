// moe-loadlab's additions to Locust's web UI, loaded by the page before Locust's own script
// (loadgen/web/tab.py): the start form arranged as loadgen/web/form.py says, and the chart of
// TTFT, TPOT and ITL over time under the Latency (HDR) tab's table. Locust's React app owns the
// page: this script orders the form's fields (and gives registry-named ones their choices)
// before the app reads them, then only adjusts what the app has drawn (label text, a line of
// help, which fields show) and never removes a node of the app's.
(function () {
  "use strict";
  const spec = window.moeWebUi;
  if (!spec) return;
  const form = spec.form;
  // Locust's app renames its options to camelCase (its form posts them back in snake_case)
  const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
  const byField = {};
  for (const name of form.order) byField[camel(name)] = name;
  const firstGroup = form.fields[form.order[0]].group;
  const folded = new Set();  // the groups shown as a button only
  for (const name of form.order) {
    const group = form.fields[name].group;
    if (!form.open.includes(group)) folded.add(group);
  }

  // 1. Before the app reads them: the fields in our order, choice lists where a registry names
  // the choices.
  const options = window.templateArgs && window.templateArgs.extra_options;
  if (options) {
    const ordered = {};
    for (const name of form.order) if (name in options) ordered[name] = options[name];
    for (const name in options) if (!(name in ordered)) ordered[name] = options[name];
    for (const name in ordered) {
      const choices = form.fields[name] && form.fields[name].choices;
      if (choices && !ordered[name].choices) ordered[name].choices = choices;
    }
    window.templateArgs.extra_options = ordered;
  }

  const style = document.createElement("style");
  style.textContent =
    ".moe-help{font-size:12px;opacity:.7;margin:3px 2px 0;line-height:1.35;" +
    "white-space:nowrap;overflow:hidden;text-overflow:ellipsis}" +
    "[data-moe]:focus-within .moe-help{white-space:normal}" +
    ".moe-group{font-weight:600;font-size:14px;margin:8px 0 -20px;opacity:.85;cursor:pointer}" +
    ".moe-groups{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:4px 0 -8px}" +
    ".moe-groups span{font-size:13px;opacity:.75;margin-right:4px}" +
    ".moe-groups button{font:inherit;font-size:13px;padding:3px 10px;border-radius:14px;" +
    "border:1px solid #9e9e9e;background:transparent;color:inherit;cursor:pointer}" +
    ".moe-groups button[aria-pressed=true]{background:#2e7d32;border-color:#2e7d32;color:#fff}" +
    // two fields a row (Locust's own three), so that Start shows without scrolling
    "[data-moe-grid]{display:grid!important;grid-template-columns:repeat(2,minmax(0,1fr));column-gap:16px}" +
    "[data-moe-grid=locust]{grid-template-columns:repeat(3,minmax(0,1fr))}" +
    "[data-moe-grid]>:not([data-moe]){grid-column:1/-1}" +
    "[data-moe-grid=locust]>.MuiFormControl-root{grid-column:auto}" +
    "[data-moe]{min-width:0}[data-moe] .MuiFormControlLabel-label{min-width:0;overflow:hidden}" +
    ".moe-chart{margin-top:16px;background:#fff;border-radius:4px;padding:8px}" +
    ".moe-chart img{display:block;max-width:100%}";
  document.head.appendChild(style);

  // 2. Once drawn: labels, help and groups, then which fields apply.
  function boxOf(input) {
    return input.closest(".MuiFormControl-root, .MuiFormControlLabel-root");
  }

  function relabel(box, field) {
    const checkboxText = box.querySelector(".MuiFormControlLabel-label");
    const help = document.createElement(checkboxText ? "div" : "p");
    help.className = "moe-help";
    help.textContent = field.help;
    help.title = field.help;  // the whole of it, where the line cuts it short
    if (checkboxText) {
      checkboxText.textContent = field.label;
      checkboxText.appendChild(help);
      return;
    }
    const label = box.querySelector("label");
    const notch = box.querySelector("legend span");  // sizes the outline's gap for the label
    if (label) label.textContent = field.label;
    if (notch) notch.textContent = field.label;
    box.appendChild(help);
  }

  function toggle(group) {
    if (folded.has(group)) folded.delete(group);
    else folded.add(group);
    applyWhen(document);
  }

  // the folded groups' buttons, one line under the test's own fields
  function groupBar(before) {
    const bar = document.createElement("div");
    bar.className = "moe-groups";
    bar.innerHTML = "<span>More settings:</span>";
    const groups = [];
    for (const name of form.order) {
      const group = form.fields[name].group;
      if (group !== firstGroup && !groups.includes(group)) groups.push(group);
    }
    for (const group of groups) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.moeToggle = group;
      button.textContent = group;
      button.addEventListener("click", () => toggle(group));
      bar.appendChild(button);
    }
    before.before(bar);
  }

  function decorate() {
    for (const input of document.querySelectorAll("input[name], select[name]")) {
      const name = byField[input.name];
      const box = name && boxOf(input);
      if (!box || box.dataset.moe) continue;
      box.dataset.moe = name;
      box.parentElement.dataset.moeGrid = "moe";
      const top = box.closest("form") && box.closest("form").firstElementChild;
      if (top) top.dataset.moeGrid = "locust";
      const field = form.fields[name];
      relabel(box, field);
      const previous = box.previousElementSibling;
      const prevName = previous && previous.dataset.moe;
      if (!prevName || form.fields[prevName].group !== field.group) {
        const header = document.createElement("div");
        header.className = "moe-group";
        header.dataset.moeGroup = field.group;
        header.textContent = field.group;
        if (field.group !== firstGroup) {
          header.title = "fold this group";
          header.addEventListener("click", () => toggle(field.group));
        }
        box.before(header);
        if (prevName && form.fields[prevName].group === firstGroup) groupBar(header);
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

  // a field shows where its conditions hold and its group is open; a group's button shows
  // where one of its fields applies
  function applyWhen(root) {
    const boxes = [...root.querySelectorAll("[data-moe]")];
    const applying = new Set();
    for (const box of boxes) {
      const field = form.fields[box.dataset.moe];
      const applies = Object.entries(field.when).every(([name, allowed]) => {
        const value = valueIn(root, name);
        if (value === undefined) return true;
        return allowed === "given" ? value !== "" && value !== "false" : allowed.includes(value);
      });
      box.style.display = applies && !folded.has(field.group) ? "" : "none";
      if (applies) applying.add(field.group);
    }
    for (const header of root.querySelectorAll("[data-moe-group]")) {
      const group = header.dataset.moeGroup;
      header.style.display = applying.has(group) && !folded.has(group) ? "" : "none";
    }
    for (const button of root.querySelectorAll("[data-moe-toggle]")) {
      const group = button.dataset.moeToggle;
      button.style.display = applying.has(group) ? "" : "none";
      button.setAttribute("aria-pressed", String(!folded.has(group)));
    }
  }

  function onEdit(event) {
    const input = event.target;
    if (input && input.name && byField[input.name]) applyWhen(input.closest("form") || document);
  }

  // 3. The Latency (HDR) tab: the chart under its table, redrawn as the periods come in.
  let chart = null;
  let drawn = 0;
  let drawnWidth = 0;

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
      chart.innerHTML = `<img alt="TTFT, TPOT and ITL over time">`;
      table.after(chart);
      drawn = 0;
    }
    const now = Date.now();
    const width = Math.floor(chart.clientWidth - 16);  // inside the padding: drawn to fit
    if (now - drawn >= spec.refresh_ms || width !== drawnWidth) {
      drawn = now;
      drawnWidth = width;
      chart.querySelector("img").src = `${spec.chart}?w=${width}&t=${now}`;
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
