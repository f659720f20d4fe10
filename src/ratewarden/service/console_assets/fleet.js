// Who is blocked: the overview's list of the users refused most and its chart of refusals
// per rule, and the user view's chart of that user's decisions and refusals
// (GET /v1/admin/blocked, GET /v1/admin/activity; docs/console.md).
//
// It loads before console.js and waits for its events ("ratewarden:overview" after each
// overview refresh, "ratewarden:user" when a user is shown), then calls the API through
// console.js's own helpers (window.ratewardenPage): the same token, the same text-only DOM.
// Charts are drawn by uPlot (uplot.min.js, shipped in the package) on a canvas: no
// inline script or style, so the page's CSP holds.
"use strict";

(function () {
  const COLORS = ["#b42318", "#1f4e79", "#b54708", "#027a48", "#6941c6"];
  const DECISIONS_COLOR = "#7d97b3";
  const REFUSALS_COLOR = "#b42318";
  const CHART_HEIGHT = 220;
  const WINDOW_WORDS = { "15m": "15 minutes", "1h": "hour", "1d": "day" };

  const $ = (id) => document.getElementById(id);
  const page = () => window.ratewardenPage;
  const charts = {}; // container id -> its uPlot, kept while its series stay the same
  const chosen = { window: "15m", rules: "minute", user: "minute" };
  let shownUser = null;

  // A group of toggle buttons (aria-pressed), calling `changed(value)` on a new choice.
  function switchGroup(id, changed) {
    const group = $(id);
    group.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-value]");
      if (!button || button.getAttribute("aria-pressed") === "true") return;
      for (const other of group.querySelectorAll("button")) {
        other.setAttribute("aria-pressed", String(other === button));
      }
      changed(button.dataset.value);
    });
  }

  // -- who is blocked ---------------------------------------------------------------------

  async function loadBlocked() {
    const { api, query, el, cell, fillRows } = page();
    const note = $("blocked-note");
    let answer;
    try {
      answer = await api("GET", `v1/admin/blocked${query({ window: chosen.window, limit: 20 })}`);
    } catch (failure) {
      note.textContent = `Could not load who is blocked: ${failure.message}`;
      return;
    }
    const rows = answer.users.map((item) => {
      const link = el("a", { href: `#user/${encodeURIComponent(item.user)}`, class: "subject" }, item.user);
      return el(
        "tr",
        { "data-user": item.user },
        el("td", { class: "subject" }, link),
        cell(item.refusals),
        cell(item.decisions),
        cell(item.top_rule === null ? "-" : `${item.top_rule} (${item.top_rule_refusals})`, "long"),
        cell(item.top_tool === null ? "-" : `${item.top_tool} (${item.top_tool_refusals})`, "long"),
      );
    });
    const words = WINDOW_WORDS[answer.window] || answer.window;
    fillRows($("blocked-users").tBodies[0], rows, 5, `no one refused in the last ${words}`);
    const notes = [`Every daemon on the store, over the last ${words}, most refused first.`];
    if (answer.others) notes.push(`${answer.others} more refusals past a process's cap of users per second.`);
    if (answer.approximate) notes.push(`Approximate: over ${answer.sketch_keep} users in a bucket, the least refused are not kept.`);
    note.textContent = notes.join(" ");
  }

  async function loadRulesChart() {
    const { api, query } = page();
    const note = $("rules-chart-note");
    let answer;
    try {
      answer = await api("GET", `v1/admin/activity${query({ resolution: chosen.rules })}`);
    } catch (failure) {
      note.textContent = `Could not load the chart: ${failure.message}`;
      return;
    }
    const series = answer.series.map((item, index) => ({
      label: item.name,
      stroke: COLORS[index % COLORS.length],
      values: item.refusals,
    }));
    const span = answer.resolution === "hour" ? "per hour over the last day" : "per minute over the last hour";
    note.textContent = series.length
      ? `Refusals ${span}, the ${series.length} rules refusing most, every daemon on the store.`
      : `No rule refused anything over the last ${answer.resolution === "hour" ? "day" : "hour"}.`;
    draw("rules-chart", answer.times, series);
  }

  // -- the user's chart --------------------------------------------------------------------

  async function loadUserChart(user) {
    const { api, query } = page();
    const note = $("user-chart-note");
    let answer;
    try {
      answer = await api("GET", `v1/admin/activity${query({ user, resolution: chosen.user })}`);
    } catch (failure) {
      note.textContent = `Could not load the chart: ${failure.message}`;
      return;
    }
    if (user !== shownUser) return; // another user was shown meanwhile
    const [mine] = answer.series;
    draw("user-chart", answer.times, [
      { label: "decisions", stroke: DECISIONS_COLOR, values: mine.decisions },
      { label: "refusals", stroke: REFUSALS_COLOR, values: mine.refusals },
    ]);
    const span = answer.resolution === "hour" ? "per hour over the last day" : "per minute over the last hour";
    const total = (values) => values.reduce((sum, n) => sum + n, 0);
    note.textContent =
      `${total(mine.decisions)} decisions, ${total(mine.refusals)} refusals, ${span}, every daemon on the store ` +
      "(a user's decisions are counted from their first refusal, for an hour after the last).";
  }

  // -- drawing -----------------------------------------------------------------------------

  // One uPlot per container: its data replaced while its series stay the same, else drawn
  // anew. Its width follows the container's (a phone's 375 px included).
  function draw(id, times, series) {
    const container = $(id);
    const key = series.map((s) => `${s.label}\u0000${s.stroke}`).join("\u0001");
    const data = [times, ...series.map((s) => s.values)];
    let chart = charts[id];
    if (chart && chart.key === key) {
      chart.plot.setData(data);
      const width = chartWidth(container);
      if (width !== chart.plot.width) chart.plot.setSize({ width, height: CHART_HEIGHT });
      return;
    }
    if (chart) chart.plot.destroy();
    container.replaceChildren();
    container.hidden = series.length === 0;
    if (!series.length) {
      delete charts[id];
      return;
    }
    const options = {
      width: chartWidth(container),
      height: CHART_HEIGHT,
      scales: { x: { time: true }, y: { range: (plot, min, max) => [0, Math.max(1, max)] } },
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.stroke, width: 2, points: { show: false } }))],
      axes: [{}, { size: 44 }],
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
    };
    charts[id] = { key, plot: new window.uPlot(options, data, container) };
  }

  function chartWidth(container) {
    return Math.max(240, Math.floor(container.getBoundingClientRect().width || container.parentElement.clientWidth));
  }

  function resized() {
    for (const [id, chart] of Object.entries(charts)) {
      const width = chartWidth($(id));
      if (width !== chart.plot.width) chart.plot.setSize({ width, height: CHART_HEIGHT });
    }
  }

  // What the browser tests read: the charts drawn, by container id.
  window.ratewardenCharts = charts;

  function start() {
    switchGroup("blocked-window", (value) => {
      chosen.window = value;
      loadBlocked();
    });
    switchGroup("rules-resolution", (value) => {
      chosen.rules = value;
      loadRulesChart();
    });
    switchGroup("user-resolution", (value) => {
      chosen.user = value;
      if (shownUser !== null) loadUserChart(shownUser);
    });
    document.addEventListener("ratewarden:overview", () => {
      loadBlocked();
      loadRulesChart();
    });
    document.addEventListener("ratewarden:user", (event) => {
      shownUser = event.detail.user;
      loadUserChart(shownUser);
    });
    window.addEventListener("resize", resized);
  }

  start();
})();
