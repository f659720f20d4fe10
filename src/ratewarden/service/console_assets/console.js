// The ratewarden console: the page's only script (the CSP allows no other).
//
// Every figure comes from the daemon's admin API, called with the admin (or viewer) token
// typed into the sign-in form. The token lives in this tab's sessionStorage, goes out only in an
// Authorization header to this origin, never in a URL or a cookie; fetch is told to send
// no credentials of the browser's own, so no request carries an ambient credential.
// Every value from the API is put into the page as text (textContent, DOM nodes), never
// parsed as HTML: a user or tool name cannot become markup.
"use strict";

(function () {
  const TOKEN_KEY = "ratewarden.console.token";
  const REFUSALS_EVERY_MS = 1000;
  const OVERVIEW_EVERY_MS = 5000;
  // "/console" -> "/", "/prefix/console" -> "/prefix/": the API sits beside the page.
  const API_BASE = location.pathname.replace(/console\/?$/, "");
  // Views whose script is a file of its own (spend.js), loaded before this one: each is a
  // function of HELPERS (below), called whenever its view is shown.
  const EXTRA_VIEWS = window.ratewardenViews || {};
  const VIEWS = ["overview", "user", "refusals", "policy", ...Object.keys(EXTRA_VIEWS)];

  let token = sessionStorage.getItem(TOKEN_KEY);
  let current = null; // the view shown
  let timer = null; // the view's refresh timer
  let currentUser = null; // the user the user view shows
  let formUser = null; // the user the override form was last set up for
  let ruleKinds = {}; // the user's counted rules: name -> kind (rate, budget, concurrency)

  // -- small DOM helpers -----------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  // An element with attributes and children; strings become text nodes, never markup.
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function fillRows(tbody, rows, columns, emptyText) {
    if (rows.length === 0) {
      tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: String(columns) }, emptyText)));
    } else {
      tbody.replaceChildren(...rows);
      labelCells(tbody);
    }
  }

  // Each cell named after its column (data-label): on a phone a row is shown as a card of
  // "column: value" lines (console.css), so long messages wrap instead of running off.
  function labelCells(tbody) {
    const table = tbody.closest("table");
    const heads = table && table.tHead ? [...table.tHead.rows[0].cells].map((th) => th.textContent) : [];
    for (const row of tbody.rows) {
      [...row.cells].forEach((td, index) => {
        if (heads[index]) td.setAttribute("data-label", heads[index]);
      });
    }
  }

  function show(node, text, kind) {
    node.textContent = text;
    node.classList.remove("ok", "failed");
    if (kind) node.classList.add(kind);
    node.hidden = false;
  }

  function time(iso) {
    const date = new Date(iso);
    return isNaN(date) ? String(iso) : date.toLocaleTimeString();
  }

  function dateTime(iso) {
    if (!iso) return "never";
    const date = new Date(iso);
    return isNaN(date) ? String(iso) : date.toLocaleString();
  }

  function cell(value, className) {
    const text = value === null || value === undefined ? "-" : String(value);
    return el("td", className ? { class: className } : {}, text);
  }

  // A duration as the model's messages word it (policy/durations.py humanize_seconds):
  // rounded up to whole seconds, `12s`, `3m20s`, `2h5m`, `19h57m`.
  function humanizeSeconds(seconds) {
    const total = Math.max(1, Math.ceil(Number(seconds)));
    const hours = Math.floor(total / 3600);
    const minutes = Math.floor((total % 3600) / 60);
    const secs = total % 60;
    if (hours) return minutes ? `${hours}h${minutes}m` : `${hours}h`;
    if (minutes) return secs ? `${minutes}m${secs}s` : `${minutes}m`;
    return `${secs}s`;
  }

  // -- YAML, for the policy view -----------------------------------------------------------

  const YAML_WORD = /^[A-Za-z_/][A-Za-z0-9_./%-]*( [A-Za-z0-9_./%-]+)*$/;
  const YAML_FIGURE = /^[0-9]+(\.[0-9]+)?(\/[A-Za-z0-9]+( [A-Za-z0-9]+)*|%|[smhd])$/;
  const YAML_RESERVED = /^(true|false|null|yes|no|on|off|y|n)$/i;

  // A scalar as YAML reads it back: plain when nothing in it means something to YAML, else
  // single-quoted (a regex's backslashes stay as typed), double-quoted for control characters.
  function yamlScalar(value) {
    if (value === null || value === undefined) return "null";
    if (typeof value === "number" || typeof value === "boolean") return String(value);
    const text = String(value);
    if ((YAML_WORD.test(text) || YAML_FIGURE.test(text)) && !YAML_RESERVED.test(text)) return text;
    if (/[\u0000-\u001f\u007f]/.test(text)) return JSON.stringify(text);
    return `'${text.replace(/'/g, "''")}'`;
  }

  function isCollection(value) {
    return value !== null && typeof value === "object" && Object.keys(value).length > 0;
  }

  // `prefix` ("key:" or "-") with `value`: on its line when a scalar, else indented below.
  function yamlEntry(prefix, value, pad) {
    if (!isCollection(value)) {
      const empty = Array.isArray(value) ? "[]" : value !== null && typeof value === "object" ? "{}" : null;
      return [`${pad}${prefix} ${empty || yamlScalar(value)}`];
    }
    const inner = yamlLines(value, `${pad}  `);
    if (prefix !== "-") return [`${pad}${prefix}`, ...inner];
    inner[0] = `${pad}- ${inner[0].slice(pad.length + 2)}`; // the item's first line after "- "
    return inner;
  }

  function yamlLines(value, pad) {
    if (Array.isArray(value)) return value.flatMap((item) => yamlEntry("-", item, pad));
    return Object.entries(value).flatMap(([key, item]) => yamlEntry(`${yamlScalar(key)}:`, item, pad));
  }

  // A JSON document (the policy as /v1/policy gives it) as block YAML.
  function toYaml(value) {
    return isCollection(value) ? `${yamlLines(value, "").join("\n")}\n` : `${yamlEntry("", value, "")[0].trim()}\n`;
  }

  // A mapping in one line, YAML's flow style: `tool: terminal, args: {command: ...}`.
  function yamlFlow(value) {
    if (!isCollection(value)) return yamlScalar(value);
    if (Array.isArray(value)) return `[${value.map(yamlFlow).join(", ")}]`;
    const nested = (item) => (isCollection(item) && !Array.isArray(item) ? `{${yamlFlow(item)}}` : yamlFlow(item));
    return Object.entries(value).map(([key, item]) => `${yamlScalar(key)}: ${nested(item)}`).join(", ");
  }

  // -- the API ---------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      super(describeError(status, body));
      this.status = status;
      this.body = body;
    }
  }

  function describeError(status, body) {
    if (status === 0) return "the daemon did not answer";
    const fields = body && Array.isArray(body.fields) ? body.fields : [];
    if (status === 422 && fields.length) {
      return fields.map((f) => `${f.field}: ${f.message}`).join("; ");
    }
    return (body && body.message) || `HTTP ${status}`;
  }

  async function request(method, path, body, withToken) {
    const headers = { Accept: "application/json", Authorization: `Bearer ${withToken || token}` };
    const init = { method, headers, credentials: "omit", cache: "no-store", redirect: "error" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(API_BASE + path, init);
    } catch (error) {
      throw new ApiError(0, null);
    }
    let data = null;
    try {
      data = await response.json();
    } catch (error) {
      data = null;
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  // A call made while signed in: a 401 means the token stopped working (revoked, or the
  // daemon restarted with other tokens), so the console signs out and says so.
  async function api(method, path, body) {
    try {
      return await request(method, path, body);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        signOut("Token refused: the daemon no longer accepts this token. Sign in again.");
      }
      throw error;
    }
  }

  function query(params) {
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) {
      if (value !== null && value !== undefined && value !== "") search.set(name, value);
    }
    const text = search.toString();
    return text ? `?${text}` : "";
  }

  // -- sign-in ---------------------------------------------------------------------------

  async function signIn(event) {
    event.preventDefault();
    const input = $("token");
    const typed = input.value.trim();
    const error = $("sign-in-error");
    error.hidden = true;
    if (!typed) return;
    try {
      await request("GET", "v1/admin/stats", undefined, typed); // an admin's or a viewer's
    } catch (failure) {
      const status = failure instanceof ApiError ? failure.status : 0;
      let message = `Could not sign in: ${failure.message}`;
      if (status === 401) message = "Token refused: the daemon does not know this token.";
      if (status === 403) message = "Token refused: this is a check token; the console needs an admin token or a viewer token.";
      show(error, message);
      input.select();
      return;
    }
    input.value = "";
    token = typed;
    sessionStorage.setItem(TOKEN_KEY, token);
    enter();
  }

  function signOut(message) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    stopTimer();
    current = null;
    for (const name of VIEWS) $(`view-${name}`).hidden = true;
    $("nav").hidden = true;
    $("sign-out").hidden = true;
    showRole(null);
    $("sign-in").hidden = false;
    const error = $("sign-in-error");
    if (message) show(error, message);
    else error.hidden = true;
    $("token").focus();
  }

  function enter() {
    $("sign-in").hidden = true;
    $("nav").hidden = false;
    $("sign-out").hidden = false;
    showRole(null);
    learnRole();
    route();
  }

  // What the token may do (GET /v1/whoami). A viewer token reads only: the controls that
  // reset, override or reload are not shown to it (the daemon would answer them 403).
  // They stay hidden until the daemon says "admin"; one without /v1/whoami (404) has no
  // viewer role, so any token it let in is an admin's.
  async function learnRole() {
    let role = null;
    try {
      role = (await api("GET", "v1/whoami")).role;
    } catch (failure) {
      if (failure instanceof ApiError && failure.status === 404) role = "admin";
    }
    if (token) showRole(role);
  }

  function showRole(role) {
    document.body.classList.toggle("read-only", role !== "admin");
    const badge = $("role");
    badge.textContent = role === "viewer" ? "viewer: read only" : "";
    badge.hidden = role !== "viewer";
  }

  // -- views -----------------------------------------------------------------------------

  function route() {
    if (!token) return;
    // `#user/<name>` opens the user view on that user (fleet.js links to it).
    const [wanted, ...named] = location.hash.replace(/^#/, "").split("/");
    const name = VIEWS.includes(wanted) ? wanted : "overview";
    if (name === "user" && named.length) pickUser(named.join("/"));
    stopTimer();
    current = name;
    for (const view of VIEWS) $(`view-${view}`).hidden = view !== name;
    for (const link of document.querySelectorAll("#nav a")) {
      link.classList.toggle("active", link.dataset.view === name);
      if (link.dataset.view === name) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    (LOADERS[name] || (() => EXTRA_VIEWS[name](HELPERS)))();
  }

  function pickUser(encoded) {
    try {
      currentUser = decodeURIComponent(encoded);
    } catch (error) {
      return; // not a name this console wrote: the view opens on whoever it showed
    }
    $("user-name").value = currentUser;
  }

  function stopTimer() {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  }

  // Calls `load` now and then every `everyMs` while `view` is shown and the tab visible.
  function every(view, everyMs, load) {
    const tick = async () => {
      if (current !== view || !token) return;
      if (!document.hidden) {
        try {
          await load();
        } catch (error) {
          // Shown by `load` itself; a failed poll is tried again at the next tick.
        }
      }
      if (current === view && token) timer = setTimeout(tick, everyMs);
    };
    tick();
  }

  // Overview ------------------------------------------------------------------------------

  async function loadOverview() {
    let stats;
    try {
      stats = await api("GET", "v1/admin/stats");
    } catch (error) {
      $("overview-meta").textContent = `Could not load the overview: ${error.message}`;
      throw error;
    }
    const totals = stats.totals;
    const daemons = new Set(stats.processes.map((p) => p.daemon)).size;
    $("overview-meta").textContent =
      `${counted(stats.processes.length, "worker")} of ${counted(daemons, "daemon")} on the store; ` +
      `answered by worker ${stats.pid}; ` +
      `figures at ${time(stats.generated_at)}, read every ${stats.sample_interval_s} s.`;
    $("overview-decisions").textContent = String(totals.decisions);
    $("overview-refusals").textContent = String(totals.refusals);
    $("overview-split").textContent = `${totals.denied} denied, ${totals.asked} asked`;
    $("overview-ratio").textContent =
      totals.denial_ratio === null ? "-" : `${(totals.denial_ratio * 100).toFixed(1)} %`;
    const store = stats.store;
    const storeState = $("overview-store");
    storeState.textContent = store.reachable ? "reachable" : "unreachable";
    storeState.className = `big ${store.reachable ? "state-ok" : "state-bad"}`;
    $("overview-store-detail").textContent =
      `${store.description}; circuit ${store.circuit}` + (store.error ? `; ${store.error}` : "");
    $("overview-policy").textContent = stats.policy.version;
    $("overview-policy-detail").textContent = `${stats.policy.rules} rules from ${stats.policy.source}`;
    drawChart(stats.minutes);
    fillRanked($("overview-rules"), stats.top_rules, "no refusals in the last 15 minutes");
    fillRanked($("overview-tools"), stats.top_tools, "no refusals in the last 15 minutes");
    showReload($("overview-reload"), stats.last_reload);
    fillProcesses(stats);
    document.dispatchEvent(new CustomEvent("ratewarden:overview")); // fleet.js: who is blocked
  }

  function counted(n, noun) {
    return `${n} ${noun}${n === 1 ? "" : "s"}`;
  }

  function fillProcesses(stats) {
    const rows = stats.processes.map((p) => {
      const last = p.last_reload;
      const reload = !last ? "none" : `${last.ok ? "ok" : "refused"}, ${dateTime(last.at)}, ${last.trigger}`;
      const state = !last || last.ok ? "" : "state-bad";
      return el(
        "tr",
        {},
        cell(p.daemon),
        cell(p.pid),
        cell(p.policy.version, "mono"),
        cell(reload, state),
        cell(p.totals.decisions),
        cell(p.totals.refusals),
        cell(humanizeSeconds(p.uptime_s)),
      );
    });
    fillRows($("overview-processes").tBodies[0], rows, 7, "no process has reported");
    $("overview-processes-note").textContent = stats.processes_error
      ? `Only the worker that answered: the store did not list the others (${stats.processes_error}).`
      : "Every worker of every daemon on the store; the figures above are their sum.";
  }

  function drawChart(minutes) {
    const highest = Math.max(1, ...minutes.map((m) => m.decisions));
    const bars = minutes.map((minute) => {
      const total = el("div", { class: "total" });
      total.style.height = `${(100 * minute.decisions) / highest}%`; // CSSOM: allowed by the CSP
      const refused = el("div", { class: "refused" });
      refused.style.height = minute.decisions ? `${(100 * minute.refusals) / minute.decisions}%` : "0";
      total.append(refused);
      const label = `${time(minute.start)}: ${minute.decisions} decisions, ${minute.refusals} refusals`;
      return el("div", { class: "minute", title: label, "aria-label": label }, total);
    });
    $("overview-chart").replaceChildren(...bars);
  }

  function fillRanked(table, ranked, emptyText) {
    const rows = ranked.map((item) => el("tr", {}, cell(item.name), cell(item.refusals)));
    fillRows(table.tBodies[0], rows, 2, emptyText);
  }

  function showReload(node, last) {
    if (!last) {
      node.replaceChildren(el("p", { class: "muted" }, "No reload since the daemon started."));
      return;
    }
    const verdict = last.ok
      ? last.version === last.previous_version
        ? `unchanged (version ${last.version})`
        : `loaded version ${last.version} (was ${last.previous_version})`
      : `refused; version ${last.version} stays in force`;
    const parts = [
      el("p", {}, `${dateTime(last.at)}, ${last.trigger}: `, el("strong", { class: last.ok ? "state-ok" : "state-bad" }, verdict)),
    ];
    if (last.errors.length) parts.push(el("ul", { class: "error" }, ...last.errors.map((e) => el("li", {}, e))));
    node.replaceChildren(...parts);
  }

  // User ----------------------------------------------------------------------------------

  function loadUserView() {
    if (currentUser !== null) return showUser(currentUser);
    $("user-name").focus();
    return Promise.resolve();
  }

  async function searchUser(event) {
    event.preventDefault();
    const user = $("user-name").value.trim();
    if (!user) return;
    currentUser = user;
    $("user-message").hidden = true;
    $("override-message").hidden = true;
    await showUser(user);
  }

  async function showUser(user) {
    const error = $("user-error");
    let usage, denials;
    try {
      [usage, denials] = await Promise.all([
        api("GET", `v1/usage${query({ user })}`),
        api("GET", `v1/denials${query({ user, limit: 20 })}`),
      ]);
    } catch (failure) {
      show(error, `Could not load ${user}: ${failure.message}`);
      return;
    }
    error.hidden = true;
    $("user-title").textContent = user;
    fillUsage(user, usage.limits);
    fillOverrideRules(user, usage.limits);
    fillDenials($("user-denials"), denials.denials, false, "no recent refusals");
    $("user-result").hidden = false;
    document.dispatchEvent(new CustomEvent("ratewarden:user", { detail: { user } })); // fleet.js
    await loadOverrides(user);
  }

  function limitText(item) {
    if (item.limit === null) return "unlimited";
    if (item.kind === "access") return "refuses what it matches";
    if (item.kind === "budget") return `${money(item.limit)} ${item.currency}/${item.period}`;
    if (item.kind === "concurrency") return `${item.limit} at once`;
    return `${item.limit}/${item.window}`;
  }

  function money(value) {
    return Number(value).toFixed(2);
  }

  // The table `ratewarden usage` prints, plus whether the rule is at its limit and a reset.
  function usageRow(user, item) {
    const counted = item.limit !== null && item.kind !== "access";
    const atLimit = counted && item.remaining !== null && Number(item.remaining) <= 0;
    const budget = item.kind === "budget";
    let used = "-", remaining = "-", resets = "-";
    if (counted) {
      used = budget ? money(item.used) + (item.reserved ? ` (+${money(item.reserved)} reserved)` : "") : String(item.used);
      remaining = budget ? money(item.remaining) : String(item.remaining);
      if (item.kind !== "concurrency" && (item.used || item.reserved)) resets = humanizeSeconds(item.reset_after);
    }
    const name = el("td", {}, item.rule, atLimit ? el("span", { class: "badge" }, "at limit") : null);
    const action = el("td", {});
    if (counted) action.append(resetButton(user, item, action));
    const row = el("tr", { "data-rule": item.rule }, name, cell(item.kind), cell(limitText(item)), cell(used), cell(remaining), cell(resets), cell(item.mode), action);
    if (atLimit) row.classList.add("at-limit");
    return row;
  }

  function fillUsage(user, limits) {
    const rows = limits.map((item) => usageRow(user, item));
    fillRows($("usage-table").tBodies[0], rows, 8, "no rules apply");
  }

  // A reset forgets what a counter holds (for a budget, money): the first click only asks,
  // naming the amount as the daemon reads it now; a second, explicit click resets.
  function resetButton(user, item, action) {
    const button = el("button", { type: "button", class: "small secondary", "aria-label": `Reset ${item.rule}` }, "Reset");
    button.addEventListener("click", () => askReset(user, item, action, button));
    return button;
  }

  async function askReset(user, item, action, button) {
    button.disabled = true;
    let now = item;
    try {
      const usage = await api("GET", `v1/usage${query({ user })}`);
      now = usage.limits.find((found) => found.rule === item.rule) || item;
    } catch (failure) {
      // The amount the table shows, read a moment ago, stands in.
    }
    const question = el("span", { class: "reset-question", role: "alert" }, `Forget ${amountText(now)} by ${user} on ${item.rule}?`);
    const confirm = el("button", { type: "button", class: "small danger", "aria-label": `Confirm reset ${item.rule}` }, "Forget");
    const cancel = el("button", { type: "button", class: "small secondary", "aria-label": `Cancel reset ${item.rule}` }, "Cancel");
    confirm.addEventListener("click", () => resetRule(user, item.rule, confirm));
    cancel.addEventListener("click", () => action.replaceChildren(resetButton(user, item, action)));
    action.replaceChildren(question, confirm, cancel);
    cancel.focus(); // Enter keeps the counters: forgetting takes a deliberate click
  }

  // `1.20 USD spent (+0.50 reserved)`, `2 calls`, `1 slots in use` (as `ratewarden reset`).
  function amountText(item) {
    if (item.kind === "budget") {
      const reserved = item.reserved ? ` (+${money(item.reserved)} reserved)` : "";
      return `${money(item.used)} ${item.currency} spent${reserved}`;
    }
    return item.kind === "concurrency" ? `${item.used} slots in use` : `${item.used} calls`;
  }

  async function resetRule(user, rule, button) {
    button.disabled = true;
    const message = $("user-message");
    try {
      const answer = await api("POST", "v1/admin/reset", { user, rule });
      const forgot = (answer.forgotten || []).map((item) => `${amountText(item)} on ${item.rule}`);
      show(message, `Reset ${rule} for ${user}: ${answer.deleted} counter(s) cleared; forgot ${forgot.join("; ") || "nothing counted"}.`, "ok");
    } catch (failure) {
      show(message, `Reset failed: ${failure.message}`, "failed");
    }
    if (currentUser === user) await showUser(user);
  }

  // The form follows the user shown: another user starts it afresh (on the rule at its
  // limit, else the first); the same user, read again after a change, keeps what is typed.
  function fillOverrideRules(user, limits) {
    const select = $("override-rule");
    const chosen = select.value;
    const before = ruleKinds[chosen];
    const counted = limits.filter((item) => item.kind !== "access");
    const full = counted.find((item) => item.limit !== null && Number(item.remaining) <= 0);
    ruleKinds = Object.fromEntries(counted.map((item) => [item.rule, item]));
    select.replaceChildren(...counted.map((item) => el("option", { value: item.rule }, item.rule)));
    const fresh = formUser !== user;
    formUser = user;
    if (!fresh && ruleKinds[chosen]) {
      select.value = chosen;
      if (before && before.kind === ruleKinds[chosen].kind) return;
    } else if (full) {
      select.value = full.rule;
    }
    if (fresh) resetOverrideForm();
    ruleChanged();
  }

  function resetOverrideForm() {
    $("override-value").value = "";
    $("override-ttl").value = "10m";
    $("override-reason").value = "";
    $("override-message").hidden = true;
  }

  // A rule offers the limit of its own kind, or none (unlimited): a budget rule a budget.
  function ruleChanged() {
    const item = ruleKinds[$("override-rule").value];
    const kinds = item ? [item.kind, "unlimited"] : ["unlimited"];
    $("override-kind").replaceChildren(...kinds.map((kind) => el("option", { value: kind }, kind)));
    $("override-value").value = "";
    kindChanged();
  }

  function valueHint(kind, item) {
    if (kind === "rate") return `20/${(item && item.window) || "minute"}`;
    if (kind === "budget") return `5.00/${(item && item.period) || "day"}`;
    if (kind === "concurrency") return "3";
    return "";
  }

  function kindChanged() {
    const kind = $("override-kind").value;
    const value = $("override-value");
    value.placeholder = valueHint(kind, ruleKinds[$("override-rule").value]);
    value.disabled = kind === "unlimited";
    value.required = kind !== "unlimited";
  }

  function overrideBody(user) {
    const kind = $("override-kind").value;
    const body = { users: [user], rule: $("override-rule").value, reason: $("override-reason").value.trim() };
    const value = $("override-value").value.trim();
    if (kind === "unlimited") body.unlimited = true;
    else if (kind === "concurrency") body.concurrency = /^\d+$/.test(value) ? Number(value) : value;
    else body[kind] = value;
    const ttl = $("override-ttl").value.trim();
    if (ttl) body.ttl = ttl;
    return body;
  }

  async function grantOverride(event) {
    event.preventDefault();
    if (currentUser === null) return;
    const user = currentUser;
    const message = $("override-message");
    const button = event.submitter || $("override-form").querySelector("button");
    button.disabled = true;
    try {
      const made = await api("POST", "v1/admin/overrides", overrideBody(user));
      const expires = made.expires_at ? `until ${dateTime(made.expires_at)}` : "with no expiry";
      show(message, `Override granted on ${made.rule} for ${user}: ${overrideLimit(made)}, ${expires}.`, "ok");
      $("override-reason").value = "";
    } catch (failure) {
      const text = failure.status === 404
        ? "This daemon has no overrides API (404)."
        : `Override refused: ${failure.message}`;
      show(message, text, "failed");
    } finally {
      button.disabled = false;
    }
    await showUser(user);
  }

  function overrideLimit(item) {
    if (item.unlimited) return "unlimited";
    if (item.rate !== undefined && item.rate !== null) return `rate ${item.rate}`;
    if (item.budget !== undefined && item.budget !== null) return `budget ${item.budget}`;
    if (item.concurrency !== undefined && item.concurrency !== null) return `${item.concurrency} at once`;
    return "-";
  }

  async function loadOverrides(user) {
    const tbody = $("overrides-table").tBodies[0];
    let listed;
    try {
      listed = await api("GET", "v1/admin/overrides");
    } catch (failure) {
      const text = failure.status === 404 ? "this daemon has no overrides API" : `could not list: ${failure.message}`;
      fillRows(tbody, [], 6, text);
      return;
    }
    const mine = (listed.overrides || []).filter((o) => Array.isArray(o.users) && o.users.includes(user));
    const rows = mine.map((item) => {
      const button = el("button", { type: "button", class: "small secondary", "aria-label": `Remove override ${item.id}` }, "Remove");
      button.addEventListener("click", () => removeOverride(user, item.id, button));
      const limit = overrideLimit(item) + (item.active === false ? ` (idle: ${item.idle || "not applied"})` : "");
      return el("tr", {}, cell(item.rule), cell(limit, "long"), cell(item.expires_at ? dateTime(item.expires_at) : "never"), cell(item.reason, "long"), cell(item.set_by), el("td", {}, button));
    });
    fillRows(tbody, rows, 6, "none");
  }

  async function removeOverride(user, id, button) {
    button.disabled = true;
    try {
      await api("DELETE", `v1/admin/overrides/${encodeURIComponent(id)}`);
      show($("override-message"), "Override removed.", "ok");
    } catch (failure) {
      show($("override-message"), `Could not remove the override: ${failure.message}`, "failed");
    }
    await showUser(user);
  }

  // Refusals ------------------------------------------------------------------------------

  function fillDenials(table, denials, withUser, emptyText) {
    const rows = denials.map((entry) => {
      const cells = [cell(time(entry.time))];
      if (withUser) cells.push(el("td", { class: "subject" }, String(entry.user)));
      // The canonical tool, and the host's own name for it when it had another.
      const tool = entry.host_tool ? `${entry.tool} (${entry.host_tool})` : entry.tool;
      cells.push(cell(tool, "long"), cell(entry.rule), cell(entry.event), cell(entry.message, "long"));
      return el("tr", { "data-id": String(entry.id) }, ...cells);
    });
    fillRows(table.tBodies[0], rows, withUser ? 6 : 5, emptyText);
  }

  async function loadRefusals() {
    const filters = {
      user: $("filter-user").value.trim(),
      tool: $("filter-tool").value.trim(),
      rule: $("filter-rule").value.trim(),
      limit: 100,
    };
    const status = $("refusals-status");
    let answer;
    try {
      answer = await api("GET", `v1/denials${query(filters)}`);
    } catch (failure) {
      status.textContent = `Could not load refusals: ${failure.message}`;
      throw failure;
    }
    fillDenials($("refusals-table"), answer.denials, true, "no refusals recorded");
    status.textContent = `${answer.denials.length} shown, newest first; updated ${new Date().toLocaleTimeString()} (every second).`;
  }

  // Policy --------------------------------------------------------------------------------

  async function loadPolicy() {
    const [policy, stats] = await Promise.all([api("GET", "v1/policy"), api("GET", "v1/admin/stats")]);
    $("policy-version").textContent = policy.version;
    $("policy-source").textContent = policy.source;
    showReload($("policy-reload"), stats.last_reload);
    const defaults = policy.policy.defaults || {};
    const rules = Array.isArray(policy.policy.rules) ? policy.policy.rules : [];
    const rows = rules.map((rule) => el("tr", {}, cell(rule.name), cell(matchText(rule), "long"), cell(Array.isArray(rule.per) ? rule.per.join(", ") : "-"), cell(ruleLimit(rule)), cell(modeText(rule, defaults))));
    fillRows($("policy-rules").tBodies[0], rows, 5, "no rules");
    $("policy-yaml").textContent = toYaml(policy.policy);
    await showRuntimeOverrides();
  }

  // The runtime overrides (set through the API, kept in the store) in the file's words.
  async function showRuntimeOverrides() {
    const node = $("policy-runtime");
    let listed;
    try {
      listed = await api("GET", "v1/admin/overrides");
    } catch (failure) {
      node.textContent = failure.status === 404 ? "# this daemon has no overrides API\n" : `# could not list them: ${failure.message}\n`;
      return;
    }
    const overrides = (listed.overrides || []).map((item) =>
      Object.fromEntries(Object.entries(item).filter(([key, value]) => value !== null && value !== undefined && !(key === "unlimited" && value === false))),
    );
    node.textContent = overrides.length ? toYaml({ runtime_overrides: overrides }) : "runtime_overrides: []\n";
  }

  function matchText(rule) {
    const parts = [];
    if (rule.match && Object.keys(rule.match).length) parts.push(yamlFlow(rule.match));
    if (rule.unless && Object.keys(rule.unless).length) parts.push(`unless ${yamlFlow(rule.unless)}`);
    return parts.length ? parts.join(" ") : "every call";
  }

  function ruleLimit(rule) {
    if (rule.deny !== undefined) return `deny: ${rule.deny}`;
    if (rule.ask !== undefined) return `ask: ${rule.ask}`;
    if (rule.rate !== undefined) return `rate ${rule.rate}` + (rule.burst ? `, burst ${rule.burst}` : "");
    if (rule.budget !== undefined) return `budget ${rule.budget}`;
    if (rule.concurrency !== undefined) return `${rule.concurrency} at once`;
    return "-";
  }

  function modeText(rule, defaults) {
    const mode = rule.mode || defaults.mode || "enforce";
    return rule.on_exceed ? `${mode}, on exceed ${rule.on_exceed}` : mode;
  }

  async function reloadPolicy() {
    const button = $("reload-button");
    button.disabled = true;
    try {
      await api("POST", "v1/admin/reload");
    } catch (failure) {
      // A refused file is a 422 naming every error; the last-reload panel shows them.
    } finally {
      button.disabled = false;
    }
    if (current === "policy") await loadPolicy();
  }

  const LOADERS = {
    overview: () => every("overview", OVERVIEW_EVERY_MS, loadOverview),
    user: () => loadUserView(),
    refusals: () => every("refusals", REFUSALS_EVERY_MS, loadRefusals),
    policy: () => loadPolicy().catch(() => {}),
  };

  // What a view in a file of its own may use (EXTRA_VIEWS); `authorization` is the header
  // for a request whose answer is not JSON (a CSV download).
  const HELPERS = Object.freeze({
    api, query, el, fillRows, cell, show, money, ApiError,
    authorization: () => `Bearer ${token}`,
    isCurrent: (view) => current === view && Boolean(token),
  });

  // What the browser tests compare with the daemon's own wording (tests/browser/).
  window.ratewardenConsole = Object.freeze({ humanizeSeconds, toYaml });
  // What fleet.js builds the views of who is blocked with (it listens for this script's
  // events rather than owning a view): the same helpers.
  window.ratewardenPage = HELPERS;

  // -- start -----------------------------------------------------------------------------

  function start() {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => signOut(null));
    $("user-form").addEventListener("submit", searchUser);
    $("override-form").addEventListener("submit", grantOverride);
    $("override-kind").addEventListener("change", kindChanged);
    $("override-rule").addEventListener("change", ruleChanged);
    $("reload-button").addEventListener("click", reloadPolicy);
    $("refusals-filter").addEventListener("submit", (event) => event.preventDefault());
    for (const id of ["filter-user", "filter-tool", "filter-rule"]) {
      $(id).addEventListener("input", () => current === "refusals" && route());
    }
    window.addEventListener("hashchange", route);
    ruleChanged();
    if (token) enter();
    else signOut(null);
  }

  start();
})();
