// The reviewer console. Plain JavaScript, no dependency, no build step.
//
// Everything shown here that an agent could have chosen (tool names and arguments,
// persona and session names, reasons, labels, record details) is written with
// textContent or as text nodes, never parsed as HTML. The token lives in this tab's
// sessionStorage and travels only in the Authorization header.
"use strict";

(() => {
  const POLL_MS = 1500;
  const DETAIL_EVERY = 4; // the open record is re-signed and re-verified every 4th poll
  const RECENT_EVENTS = 25;
  const SESSIONS_PER_PAGE = 8; // a page of sessions, not all of them (twelve made a 5,864-pixel page)
  const storage = window.sessionStorage;
  let token = storage.getItem("governor.token");
  let reviewer = storage.getItem("governor.reviewer");
  let canAnswer = storage.getItem("governor.canAnswer") === "1";
  let selected = null; // the session whose record is open
  let polls = 0;
  let pollTimer = null;
  const cards = new Map(); // approval id -> {node, expires, timeLeft}
  let pageStarts = [null]; // the `after` cursor of each sessions page seen (null: the first)
  let pageIndex = 0;

  const $ = (id) => document.getElementById(id);

  // An element; `props` sets properties (text: textContent), children are nodes or strings
  // (strings become text nodes: never markup).
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  // The arguments as the governor digests them: keys sorted (JCS), shown indented.
  function canonical(value) {
    if (Array.isArray(value)) return value.map(canonical);
    if (value !== null && typeof value === "object") {
      const out = {};
      for (const key of Object.keys(value).sort()) out[key] = canonical(value[key]);
      return out;
    }
    return value;
  }
  const pretty = (value) => JSON.stringify(canonical(value), null, 2);

  async function api(method, path, body) {
    const headers = { "Authorization": "Bearer " + token, "Accept": "application/json" };
    const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error", referrerPolicy: "no-referrer" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (!response.ok) {
      const problem = data && data.error ? data.error : {};
      const failure = new Error(problem.message || ("HTTP " + response.status));
      failure.status = response.status;
      failure.code = problem.code;
      throw failure;
    }
    return data;
  }

  // --- sign in / out ------------------------------------------------------------------

  async function signIn(event) {
    event.preventDefault();
    const presented = $("token").value.trim();
    const name = $("reviewer").value.trim();
    $("sign-in-error").textContent = "";
    if (!presented || !name) return;
    token = presented;
    let kind;
    try {
      kind = await api("GET", "/v1/token");
    } catch (failure) {
      token = null;
      $("sign-in-error").textContent = failure.status === 401
        ? "Token refused: it is neither a reviewer nor a control token of this governor."
        : "Sign-in failed: " + failure.message;
      return;
    }
    reviewer = name;
    canAnswer = Boolean(kind.reviewer);
    storage.setItem("governor.token", token);
    storage.setItem("governor.reviewer", reviewer);
    storage.setItem("governor.canAnswer", canAnswer ? "1" : "0");
    $("token").value = "";
    start();
  }

  function signOut(message) {
    if (pollTimer !== null) clearTimeout(pollTimer);
    pollTimer = null;
    token = reviewer = null;
    storage.removeItem("governor.token");
    storage.removeItem("governor.reviewer");
    storage.removeItem("governor.canAnswer");
    cards.clear();
    $("approvals").replaceChildren();
    $("sessions").replaceChildren();
    $("locks").replaceChildren();
    $("console").hidden = true;
    $("sign-out").hidden = true;
    $("whoami").textContent = "";
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = message || "";
  }

  function start() {
    $("sign-in").hidden = true;
    $("console").hidden = false;
    $("sign-out").hidden = false;
    $("whoami").textContent = reviewer + (canAnswer ? " (reviewer)" : " (read only: a control token cannot answer approvals)");
    poll();
  }

  // --- polling ------------------------------------------------------------------------

  async function poll() {
    pollTimer = null;
    try {
      const after = pageStarts[pageIndex];
      const [approvals, sessions, locks] = await Promise.all([
        api("GET", "/v1/approvals?reviewer=" + encodeURIComponent(reviewer)),
        api("GET", "/v1/sessions?limit=" + SESSIONS_PER_PAGE + (after === null ? "" : "&after=" + encodeURIComponent(after))),
        api("GET", "/v1/locks"),
      ]);
      renderApprovals(approvals.approvals || [], approvals.reviewers || []);
      renderLocks(locks.locks || []);
      renderSessions(sessions.sessions || [], sessions.next);
      if (selected !== null && polls % DETAIL_EVERY === 0) await showRecord(selected);
      polls += 1;
      setStatus("Updated " + new Date().toLocaleTimeString() + ".", false);
    } catch (failure) {
      if (failure.status === 401) { signOut("Your token was refused; sign in again."); return; }
      setStatus("Cannot read the governor: " + failure.message, true);
    }
    if (token !== null) pollTimer = setTimeout(poll, POLL_MS);
  }

  function repoll() {
    if (pollTimer !== null) clearTimeout(pollTimer);
    poll();
  }

  function setStatus(text, bad) {
    const status = $("status");
    status.textContent = text;
    status.className = bad ? "status bad" : "status";
  }

  // --- approvals ----------------------------------------------------------------------

  function timeLeft(expires) {
    const seconds = Math.max(0, Math.round((expires - Date.now()) / 1000));
    if (seconds >= 3600) return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min left";
    if (seconds >= 60) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s left";
    return seconds + " s left";
  }

  function renderApprovals(approvals, reviewers) {
    const others = reviewers.filter((name) => name !== reviewer);
    $("reviewers").textContent = others.length
      ? "Also reviewing now: " + others.join(", ") + "." : "No other reviewer is looking now.";
    const seen = new Set();
    for (const approval of approvals) {
      const id = String(approval.id);
      seen.add(id);
      if (!cards.has(id)) {
        const card = approvalCard(approval);
        cards.set(id, card);
        $("approvals").append(card.node);
      }
    }
    for (const [id, card] of cards) {
      if (!seen.has(id)) { card.node.remove(); cards.delete(id); }
    }
    tick();
    $("pending-count").textContent = cards.size ? String(cards.size) : "";
    $("no-approvals").hidden = cards.size > 0;
  }

  function tick() {
    for (const card of cards.values()) card.timeLeft.textContent = timeLeft(card.expires);
  }

  function field(list, name, value) {
    list.append(el("dt", { text: name }), el("dd", { text: value === null || value === undefined ? "—" : String(value) }));
  }

  function approvalCard(approval) {
    const id = String(approval.id);
    const expires = Date.parse(approval.expires_at);
    const timeLeftNode = el("span", { class: "timeleft" });
    const details = el("dl");
    const step = approval.tool === null || approval.tool === undefined ? "(step)" : String(approval.tool);
    const sessionName = String(approval.session) + (approval.session_label ? " (" + approval.session_label + ")" : "");
    field(details, "agent", approval.agent);
    field(details, "session", sessionName);
    field(details, "step", "tool call " + step);
    field(details, "persona", approval.persona);
    field(details, "reason", approval.reason);
    field(details, "trigger", approval.trigger);
    field(details, "step digest", approval.step_digest);
    field(details, "approval", id);
    const deadline = Number.isNaN(expires) ? "the deadline" : new Date(expires).toLocaleTimeString();
    const consequences = el("ul", { class: "consequences" },
      el("li", { class: "on-approve" }, el("strong", { text: "Approve: " }), approval.on_approve || "the step runs once"),
      el("li", { class: "on-reject" }, el("strong", { text: "Reject: " }), approval.on_reject || "the step never runs"),
      el("li", { class: "on-timeout" }, el("strong", { text: "No answer by " + deadline + ": " }),
        approval.on_timeout || "the passport's on_oversight_timeout applies"));
    const args = el("pre", { class: "arguments", text: pretty(approval.arguments || {}) });
    const problem = el("p", { class: "error", role: "alert" });
    const approve = el("button", { type: "button", class: "approve", text: "Approve" });
    const reject = el("button", { type: "button", class: "reject", text: "Reject" });
    const note = el("input", { type: "text", class: "note", placeholder: "note (optional, recorded)", maxLength: 500 });
    const actions = el("div", { class: "actions" }, note, approve, reject);
    const editable = Boolean(approval.plan_editing);
    let editor = null;
    const buttons = [approve, reject, note];
    if (editable) {
      const edit = el("button", { type: "button", class: "edit", text: "Edit arguments" });
      const area = el("textarea", { class: "edited", spellcheck: false });
      area.value = pretty(approval.arguments || {});
      const send = el("button", { type: "button", class: "approve-edited", text: "Approve edited step" });
      const cancel = el("button", { type: "button", text: "Cancel" });
      editor = el("div", { class: "editor", hidden: true },
        el("label", { text: "Edited arguments (JSON object): the approval binds to the edited step" }), area,
        el("div", { class: "actions" }, send, cancel));
      edit.addEventListener("click", () => { editor.hidden = false; area.focus(); });
      cancel.addEventListener("click", () => { editor.hidden = true; area.value = pretty(approval.arguments || {}); });
      send.addEventListener("click", () => {
        let edited;
        try { edited = JSON.parse(area.value); } catch (failure) {
          problem.textContent = "The edited arguments are not JSON: " + failure.message; return;
        }
        if (edited === null || typeof edited !== "object" || Array.isArray(edited)) {
          problem.textContent = "The edited arguments must be a JSON object."; return;
        }
        answer("approve", edited);
      });
      actions.append(edit);
      buttons.push(edit, send);
    }
    for (const button of buttons) button.disabled = !canAnswer;
    const node = el("article", { class: "approval", "data-approval": id },
      el("header", {}, el("span", { class: "tool", text: approval.tool === null ? "(step)" : String(approval.tool) }), timeLeftNode),
      details, args, consequences, actions, editor, problem);

    async function answer(decision, edited) {
      problem.textContent = "";
      for (const button of buttons) button.disabled = true;
      const body = { decision, reviewer };
      if (note.value.trim()) body.reason = note.value.trim();
      if (edited !== undefined) body.edited_arguments = edited;
      try {
        const result = await api("POST", "/v1/approvals/" + encodeURIComponent(id), body);
        node.classList.add("answered");
        const verb = decision === "approve" ? "Approved" : "Rejected";
        actions.replaceChildren(el("span", { class: "outcome", text: verb + " by " + reviewer + (result.edited ? " (edited)" : "") }));
        confirm(verb + (result.edited ? " (edited)" : "") + " " + step + " in session " + sessionName + " at "
          + new Date().toLocaleTimeString() + ": " + (decision === "approve" ? approval.on_approve : approval.on_reject));
        if (editor) editor.hidden = true;
      } catch (failure) {
        if (failure.status === 401) { signOut("Your token was refused; sign in again."); return; }
        problem.textContent = failure.code === "approval_not_pending" || failure.code === "approval_answered"
          ? "This approval is no longer pending (answered elsewhere or timed out)."
          : "Not answered: " + failure.message;
        for (const button of buttons) button.disabled = !canAnswer;
      }
    }
    approve.addEventListener("click", () => answer("approve"));
    reject.addEventListener("click", () => answer("reject"));
    return { node, expires, timeLeft: timeLeftNode };
  }

  // The reviewer's answers stay listed after their cards leave the pending list.
  function confirm(text) {
    $("answered-panel").hidden = false;
    $("answered").prepend(el("li", { class: "confirmation", text }));
    setStatus(text, false);
  }

  // --- locks --------------------------------------------------------------------------

  function renderLocks(locks) {
    const rows = locks.map((lock) => {
      const action = el("td");
      if (lock.state === "locked") {
        const lift = el("button", { type: "button", class: "lift", text: "Lift" });
        lift.disabled = token === null;
        lift.addEventListener("click", async () => {
          lift.disabled = true;
          try { await api("POST", "/v1/locks/" + encodeURIComponent(lock.id) + "/lift", { by: reviewer }); }
          catch (failure) { action.append(el("span", { class: "error", text: " " + failure.message })); lift.disabled = false; }
        });
        action.append(lift);
      } else {
        action.append("lifted by " + (lock.lifted_by || "?") + " at " + (lock.lifted_at || "?"));
      }
      return el("tr", { "data-lock": String(lock.id) },
        el("td", {}, el("code", { text: String(lock.id) })), el("td", { class: "id", text: String(lock.session) }),
        el("td", { text: String(lock.cause) }), el("td", { text: String(lock.locked_at) }),
        el("td", { class: "state-" + lock.state, text: String(lock.state) }), action);
    });
    $("no-locks").hidden = locks.some((lock) => lock.state === "locked");
    $("locks").replaceChildren(rows.length ? el("table", {},
      el("thead", {}, el("tr", {}, ...["lock", "session", "cause", "locked at", "state", ""].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows)) : "");
  }

  // --- sessions -----------------------------------------------------------------------

  // 12, 0.25, 4.1: whole numbers as they are, others to 2 significant decimals
  const amount = (n) => Number.isInteger(n) ? String(n) : String(Number(n.toFixed(n < 1 ? 4 : 2)));

  function bar(name, used, limit) {
    const row = el("div", { class: "bar" });
    const value = Number(used) || 0;
    if (limit === null || limit === undefined) {
      row.append(el("span", { text: "—" }), el("span", { text: name + ": " + amount(value) + " (no cap)" }));
      return row;
    }
    const cap = Number(limit);
    const meter = el("meter", { min: 0, max: cap, value: Math.min(value, cap), low: cap * 0.75, high: cap * 0.9, optimum: 0 });
    meter.title = amount(value) + " of " + amount(cap);
    if (value >= cap) row.classList.add("over");
    row.append(meter, el("span", { text: name + ": " + amount(value) + " / " + amount(cap) }));
    return row;
  }

  function renderSessions(sessions, next) {
    $("no-sessions").hidden = sessions.length > 0;
    const rows = sessions.map((view) => {
      const bars = el("td");
      const limits = view.limits || {};
      bars.append(bar("iterations", view.iterations, limits.max_iterations));
      bars.append(bar("tool calls", view.tool_calls, limits.max_tool_calls_per_session));
      for (const budget of view.budgets || []) {
        const scope = budget.scope + (budget.persona ? " " + budget.persona : "");
        bars.append(bar(budget.dimension + " (" + scope + ")", budget.used, budget.limit));
      }
      const open = el("button", { type: "button", class: "open-record", text: "Record" });
      open.addEventListener("click", () => showRecord(String(view.session)));
      const pending = (view.pending_approvals || []).length;
      return el("tr", { "data-session": String(view.session) },
        el("td", {}, el("div", { class: "id mono", text: String(view.session) }),
          view.label ? el("div", { class: "label", text: String(view.label) }) : null),
        el("td", { class: "state-" + (view.halt_cause ? "halted" : view.state),
          text: view.halt_cause ? "halted (" + view.halt_cause + ")" + (view.state === "ended" ? ", ended" : "") : String(view.state) }),
        el("td", { text: view.started_at || "" }), bars,
        el("td", { text: String(pending) }), el("td", { text: String(view.events) }), el("td", {}, open));
    });
    const parts = [];
    if (rows.length) parts.push(el("table", {},
      el("thead", {}, el("tr", {}, ...["session", "state", "started", "budgets", "pending", "events", ""].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows)));
    $("sessions").replaceChildren(...parts);
    if (next && pageStarts.length === pageIndex + 1) pageStarts.push(next);
    if (!next) pageStarts.length = pageIndex + 1;
    $("sessions-next").disabled = !next;
    $("sessions-prev").disabled = pageIndex === 0;
    $("sessions-page").textContent = "page " + (pageIndex + 1) + (next ? "" : " (last)");
  }

  // --- a session's record -------------------------------------------------------------

  async function showRecord(session) {
    selected = session;
    $("session-detail").hidden = false;
    $("detail-id").textContent = session;
    let answer;
    try {
      answer = await api("GET", "/v1/sessions/" + encodeURIComponent(session) + "/verification");
    } catch (failure) {
      if (failure.status === 401) { signOut("Your token was refused; sign in again."); return; }
      $("verification").replaceChildren(el("p", { class: "error", text: "No record: " + failure.message }));
      $("events").replaceChildren();
      return;
    }
    if (selected !== session) return;
    const verdict = answer.verification || {};
    const record = answer.record || {};
    const failure = verdict.first_failure;
    const steps = el("ul", { class: "steps" }, ...(verdict.steps || []).map((step) =>
      el("li", { class: step.status, text: step.step + ". " + step.name + ": " + step.status + (step.message ? " — " + step.message : "") })));
    $("verification").replaceChildren(
      el("span", { id: "verdict", class: "verdict " + (verdict.verdict === "INVALID" ? "invalid" : "valid"),
        text: verdict.verdict === "VALID" ? "Valid enforcement record (each step below)"
          : verdict.verdict === "INCOMPLETE"
            ? "No step failed; not every step ran in full (step " + (verdict.not_checked || []).join(", ") +
              "): this governor checked its own record with its own key, an auditor resolves it with governor verify"
            : "Invalid record: step " + (failure ? failure.step + " (" + failure.name + "): " + failure.message : "?") }),
      el("p", { class: "empty", text: "Outcome " + record.outcome + ", " + (record.events || []).length + " events, signed " + record.iat + ". An auditor checks it offline with governor verify." }),
      steps);
    const events = (record.events || []).slice(-RECENT_EVENTS).reverse();
    $("events").replaceChildren(...events.map((event) => el("li", {},
      el("div", { class: "head", text: "#" + (event.seq === undefined ? "?" : event.seq) + " " + event.cause + " → " + event.action + "  " + (event.at || "") }),
      event.detail ? el("pre", { text: pretty(event.detail) }) : null)));
  }

  // --- wiring -------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => signOut(""));
    $("detail-close").addEventListener("click", () => { selected = null; $("session-detail").hidden = true; });
    $("detail-refresh").addEventListener("click", () => { if (selected !== null) showRecord(selected); });
    $("sessions-next").addEventListener("click", () => { if (pageStarts.length > pageIndex + 1) { pageIndex += 1; repoll(); } });
    $("sessions-prev").addEventListener("click", () => { if (pageIndex > 0) { pageIndex -= 1; repoll(); } });
    setInterval(tick, 1000);
    if (token !== null && reviewer !== null) start();
  });
})();
