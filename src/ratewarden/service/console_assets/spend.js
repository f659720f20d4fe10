// The console's Spend view: what each budget rule charged per UTC day (GET
// /v1/admin/spend), drawn with uPlot (uplot.min.js, packaged) and listed in a table, for a
// user, a team or everyone, with the part of each amount model calls charged; the same
// rows as CSV for chargeback. And the user view's "Spent today": what the shown user's
// budgets charged today, model calls beside tool calls (on console.js's "ratewarden:user"
// event, through its helpers, window.ratewardenPage, as fleet.js does).
//
// Loaded before console.js, it registers the view in window.ratewardenViews; console.js
// calls it with its helpers whenever the view is shown. As there, every value from the API
// goes into the page as text, never as markup.
"use strict";

(function () {
  const DAY_MS = 86400000;
  const COLOURS = ["#1f4e79", "#b42318", "#1a7f37", "#8a5a00", "#6e40c9"];
  const DAY_STEPS = [1, 2, 7, 14, 28].map((days) => days * 86400); // x ticks, in seconds
  const $ = (id) => document.getElementById(id);
  const isoDay = (seconds) => new Date(seconds * 1000).toISOString().slice(0, 10);
  let chart = null; // the uPlot instance drawn last
  let tools = null; // console.js's helpers
  let wired = false;

  function filters() {
    return {
      user: $("spend-user").value.trim(),
      team: $("spend-team").value.trim(),
      since: $("spend-since").value,
    };
  }

  async function load() {
    const error = $("spend-error");
    error.hidden = true;
    let answer;
    try {
      answer = await tools.api("GET", `v1/admin/spend${tools.query(filters())}`);
    } catch (failure) {
      tools.show(error, `Could not read the spend: ${failure.message}`);
      return;
    }
    if (!tools.isCurrent("spend")) return;
    $("spend-range").textContent =
      `${answer.since} to ${answer.until} (UTC days); kept ${answer.retention_days} days`;
    $("spend-totals").textContent = answer.totals.length
      ? "Total: " + answer.totals.map((t) => amount(t.amount, t.currency)).join("; ")
      : "Nothing spent in these days.";
    $("spend-truncated").hidden = !answer.truncated;
    fillTable(answer.rows);
    draw(answer);
  }

  function amount(value, currency) {
    return currency ? `${tools.money(value)} ${currency}` : tools.money(value);
  }

  function scopeText(scope) {
    const parts = Object.entries(scope).map(([name, value]) => `${name}=${value}`);
    return parts.length ? parts.join(" ") : "(everyone)";
  }

  function fillTable(rows) {
    const cells = rows.map((row) =>
      tools.el(
        "tr",
        {},
        tools.cell(row.day),
        tools.cell(row.rule, "subject"),
        tools.cell(scopeText(row.scope), "subject"),
        tools.cell(amount(row.amount, row.currency), "number"),
        tools.cell(amount(row.model || 0, row.currency), "number"),
      ),
    );
    tools.fillRows($("spend-table").tBodies[0], cells, 5, "Nothing spent in these days.");
  }

  // The user view: today's rows of the user's budgets, each with its model calls' part
  // and the rest (tool calls, and reservations charged at their estimate when they
  // expired). Per budget, never added up: one call counts in every budget that charged it.
  let todayAsked = 0; // the latest request: an older answer arriving late is dropped
  async function userToday(user) {
    const page = window.ratewardenPage;
    const error = $("user-spend-error");
    const asked = ++todayAsked;
    let answer;
    try {
      answer = await page.api("GET", `v1/admin/spend${page.query({ user, since: "1d" })}`);
    } catch (failure) {
      if (asked === todayAsked) page.show(error, `Could not read the spend: ${failure.message}`);
      return;
    }
    if (asked !== todayAsked) return;
    error.hidden = true;
    const money = (value, currency) =>
      currency ? `${page.money(value)} ${currency}` : page.money(value);
    const rows = answer.rows.map((row) => {
      const model = row.model || 0;
      return page.el(
        "tr",
        { "data-rule": row.rule },
        page.cell(row.rule, "subject"),
        page.cell(scopeText(row.scope), "subject"),
        page.cell(money(row.amount, row.currency), "number"),
        page.cell(money(model, row.currency), "number"),
        page.cell(money(row.amount - model, row.currency), "number"),
      );
    });
    page.fillRows($("user-spend").tBodies[0], rows, 5, "nothing spent today");
  }
  document.addEventListener("ratewarden:user", (event) => userToday(event.detail.user));

  // One bar series per currency: money of different currencies is never added up. A day
  // without spend is null (no bar), not a bar of zero height.
  function series(answer) {
    const first = Date.parse(`${answer.since}T00:00:00Z`);
    const last = Date.parse(`${answer.until}T00:00:00Z`);
    const days = [];
    for (let at = first; at <= last; at += DAY_MS) days.push(at / 1000);
    const byCurrency = new Map();
    for (const row of answer.rows) {
      const name = row.currency || "(no currency)";
      if (!byCurrency.has(name)) byCurrency.set(name, new Array(days.length).fill(null));
      const index = Math.round((Date.parse(`${row.day}T00:00:00Z`) - first) / DAY_MS);
      const values = byCurrency.get(name);
      if (index >= 0 && index < days.length) values[index] = (values[index] || 0) + row.amount;
    }
    if (byCurrency.size === 0) byCurrency.set("spent", new Array(days.length).fill(null));
    return { days, byCurrency };
  }

  function draw(answer) {
    const target = $("spend-chart");
    const { days, byCurrency } = series(answer);
    const width = Math.max(200, target.clientWidth || 300);
    const names = [...byCurrency.keys()];
    const options = {
      width,
      height: 220,
      scales: { x: { time: true, range: (u, min, max) => [min - DAY_MS / 2000, max + DAY_MS / 2000] } },
      axes: [
        { space: 44, incrs: DAY_STEPS, values: (u, ticks) => ticks.map((t) => isoDay(t).slice(5)) },
        { size: 56, values: (u, ticks) => ticks.map((t) => tools.money(t)) },
      ],
      series: [
        { label: "Day", value: (u, at) => (at === null ? "-" : isoDay(at)) },
        ...names.map((name, i) => ({
          label: name,
          stroke: COLOURS[i % COLOURS.length],
          fill: COLOURS[i % COLOURS.length],
          // Two currencies side by side (left, right of the day); more share the middle.
          paths: uPlot.paths.bars({
            size: [names.length > 1 ? 0.4 : 0.7, 48],
            align: names.length === 2 ? (i === 0 ? -1 : 1) : 0,
          }),
          points: { show: false },
          value: (u, v) => (v === null ? "-" : tools.money(v)),
        })),
      ],
    };
    if (chart) chart.destroy();
    target.replaceChildren();
    chart = new uPlot(options, [days, ...names.map((name) => byCurrency.get(name))], target);
    target.setAttribute("aria-label", `Spend per day, ${answer.since} to ${answer.until}: ` +
      (answer.totals.map((t) => amount(t.amount, t.currency)).join("; ") || "nothing"));
  }

  // The same rows as CSV: fetched with the token (it goes in a header, never in a URL),
  // then saved from a blob.
  async function downloadCsv() {
    const error = $("spend-error");
    error.hidden = true;
    const path = `v1/admin/spend${tools.query({ ...filters(), format: "csv" })}`;
    const base = location.pathname.replace(/console\/?$/, "");
    let response;
    try {
      response = await fetch(base + path, {
        headers: { Authorization: tools.authorization() },
        credentials: "omit",
        cache: "no-store",
        redirect: "error",
      });
    } catch (failure) {
      tools.show(error, "Could not download the CSV: the daemon did not answer");
      return;
    }
    if (!response.ok) {
      tools.show(error, `Could not download the CSV: HTTP ${response.status}`);
      return;
    }
    const disposition = response.headers.get("Content-Disposition") || "";
    const named = /filename="([^"]+)"/.exec(disposition);
    const link = tools.el("a", { download: named ? named[1] : "ratewarden-spend.csv" });
    link.href = URL.createObjectURL(await response.blob());
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }

  function wire() {
    if (wired) return;
    wired = true;
    $("spend-form").addEventListener("submit", (event) => {
      event.preventDefault();
      load();
    });
    $("spend-since").addEventListener("change", load);
    $("spend-csv").addEventListener("click", downloadCsv);
    window.addEventListener("resize", () => {
      if (chart && tools.isCurrent("spend")) {
        chart.setSize({ width: Math.max(200, $("spend-chart").clientWidth), height: 220 });
      }
    });
  }

  const views = (window.ratewardenViews = window.ratewardenViews || {});
  views.spend = function (helpers) {
    tools = helpers;
    wire();
    load();
  };
})();
