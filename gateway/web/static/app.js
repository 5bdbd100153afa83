// The approval page. Plain JavaScript, no dependencies, no build step.
//
// Rule of this file: text from vSphere, from callers or from the server is only ever placed with
// textContent (through el() and text nodes), never parsed as HTML.
"use strict";

(() => {
  const POLL_MS = 2000;
  const TABS = ["pending", "targets", "inventory", "agents", "audit"];
  const STATE_LABELS = {
    pending: "Pending", approved: "Approved", executing: "Running", executed: "Executed",
    failed: "Failed", denied: "Denied", expired: "Expired", cancelled: "Cancelled",
    stale: "Stale", outcome_unknown: "Outcome unknown",
  };
  const APPROVE_LABELS = { any: "approves others' proposals", others: "approves others' proposals", none: "cannot approve" };

  const state = {
    me: null, csrf: null, tab: null, pollTimer: null, tickTimer: null, busy: new Set(),
    inventoryKind: "vms", inventory: null, cards: new Map(), focus: null, focusShown: false,
    agentsWindow: "24h",
  };

  const $ = (id) => document.getElementById(id);

  // el("div", {class: "x", text: "y", title: "z", "data-id": "1"}, child, "text", ...)
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("data-") || key.startsWith("aria-")) node.setAttribute(key, String(value));
      else if (key === "dateTime") node.setAttribute("datetime", String(value));
      else if (key === "disabled" || key === "hidden" || key === "type" || key === "title" || key === "value") {
        node[key] = value;
      } else throw new Error("el(): unsupported property " + key);
    }
    for (const child of children) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  class ApiError extends Error {
    constructor(status, error) {
      super(error.message || "request failed");
      this.status = status;
      this.code = error.code || "error";
    }
  }

  async function api(path, options) {
    const method = (options && options.method) || "GET";
    const headers = { Accept: "application/json" };
    let body;
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      if (state.csrf) headers["X-CSRF-Token"] = state.csrf;
      body = JSON.stringify((options && options.body) || {});
    }
    const response = await fetch(path, { method, headers, body, credentials: "same-origin", cache: "no-store" });
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (response.ok) return data;
    const error = (data && data.error) || { code: "http_" + response.status, message: "The gateway answered " + response.status + "." };
    if (response.status === 401 && state.me && path !== "api/sign-in") showSignIn("Your session ended: " + error.message);
    throw new ApiError(response.status, error);
  }

  // ---------------------------------------------------------------- formatting

  function clock(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const m = Math.floor(s / 60);
    return m + ":" + String(s % 60).padStart(2, "0");
  }

  function ago(epochSeconds) {
    if (!epochSeconds) return "";
    const s = Math.max(0, Date.now() / 1000 - epochSeconds);
    if (s < 60) return "just now";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return new Date(epochSeconds * 1000).toLocaleString();
  }

  // <time>: "just now" / "3 min ago" shown, the exact moment (local and UTC) on hover and in datetime.
  function when(epochSeconds) {
    if (!epochSeconds) return "";
    const moment = new Date(epochSeconds * 1000);
    const utc = moment.toISOString();
    return el("time", { class: "when", dateTime: utc, text: ago(epochSeconds),
      title: moment.toLocaleString() + " (" + utc.replace("T", " ").replace(/\.\d+Z$/, " UTC") + ")" });
  }

  function objectLabel(obj) {
    const bits = [obj.type || "object", obj.name || "?"];
    if (obj.moid) bits.push("(" + obj.moid + ")");
    return bits.join(" ");
  }

  function toast(message, kind) {
    const node = $("toast");
    node.textContent = message;
    node.className = "toast " + (kind || "info");
    node.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { node.hidden = true; }, kind === "error" ? 9000 : 5000);
  }

  // ---------------------------------------------------------------- session and navigation

  function showOnly(viewId) {
    for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== viewId;
    $("loading").hidden = true;
  }

  function signInHint(role) {
    $("sign-in-hint").hidden = !role;
    // each word unbreakable (a line may end only between words, never inside "--role")
    const words = role ? ["gateway", "token", "create", "alice", "--role", role, "--kind", "person"] : [];
    clear($("sign-in-command")).append(...words.flatMap((word, i) => [i ? " " : "", el("span", { class: "word", text: word })]));
  }

  function signInWays(session) {
    // single sign-on when identity.yaml configures it; pasting a token unless that is turned off
    $("sso").hidden = !session.sso;
    $("sign-in-form").hidden = session.token_sign_in === false;
  }

  function showSignIn(message, hintRole) {
    if (hintRole !== undefined) signInHint(hintRole);
    state.me = null;
    state.csrf = null;
    stopTimers();
    $("tabs").hidden = true;
    $("who").hidden = true;
    $("sign-in-error").textContent = message || "";
    showOnly("view-sign-in");
    $("token").focus();
  }

  function signedIn(session) {
    state.me = session;
    state.csrf = session.csrf;
    $("who-name").textContent = session.name;
    $("who-role").textContent = session.role + " · " + (APPROVE_LABELS[session.approve] || session.approve);
    $("tabs").hidden = false;
    $("who").hidden = false;
    startTimers();
    route();
  }

  function route() {
    if (!state.me) return;
    const wanted = location.hash.replace("#", "");
    const linked = /^proposal=([A-Za-z0-9_-]+)$/.exec(wanted);
    state.focus = linked ? linked[1] : null;
    state.focusShown = false;
    const tab = TABS.includes(wanted) ? wanted : "pending";
    state.tab = tab;
    for (const link of document.querySelectorAll("#tabs a")) {
      link.classList.toggle("active", link.dataset.tab === tab);
      if (link.dataset.tab === tab) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    showOnly("view-" + tab);
    const loaders = { pending: loadProposals, targets: loadTargets, inventory: loadInventory, agents: loadAgents,
      audit: loadAudit };
    loaders[tab]();
  }

  function startTimers() {
    stopTimers();
    state.pollTimer = setInterval(loadProposals, POLL_MS);
    state.tickTimer = setInterval(tickCountdowns, 1000);
    loadProposals();
  }

  function stopTimers() {
    clearInterval(state.pollTimer);
    clearInterval(state.tickTimer);
    state.pollTimer = state.tickTimer = null;
  }

  async function signIn(event) {
    event.preventDefault();
    const input = $("token");
    const token = input.value.trim();
    input.value = "";
    $("sign-in-error").textContent = "";
    if (!token) return;
    try {
      signedIn(await api("api/sign-in", { method: "POST", body: { token } }));
    } catch (error) {
      $("sign-in-error").textContent = error.message;
    }
  }

  async function signOut() {
    let answer = null;
    try { answer = await api("api/sign-out", { method: "POST" }); } catch (_) { /* signed out either way */ }
    if (answer) signInWays(answer);
    showSignIn("You are signed out.", answer ? answer.sign_in_role || null : undefined);
  }

  // ---------------------------------------------------------------- pending

  function gateNote(p) {
    if (p.gated) {
      return el("p", { class: "gate gated" },
        el("strong", { text: "Blocked until approved here. " }),
        "Target " + p.target + " requires a human's approval: " + p.requested_by + " cannot confirm it over MCP.");
    }
    return el("p", { class: "gate open" },
      el("strong", { text: "Not gated. " }),
      p.requested_by + " may confirm it over MCP at any moment, without you. Approving here runs it now; " +
      "denying withdraws it.");
  }

  function affectedList(p) {
    const items = (p.affected || []).map((obj) => el("li", { text: objectLabel(obj) }));
    if (!items.length) items.push(el("li", { class: "muted", text: "none listed" }));
    return el("ul", { class: "affected" }, ...items);
  }

  // What the change will touch, read live from vSphere when it was proposed (and re-read at approval).
  function blastList(p) {
    const blast = p.blast_radius;
    if (!blast || !(blast.objects || []).length) return null;
    const items = blast.objects.slice(0, 20).map((o) => {
      const facts = [o.power_state, o.host ? "host " + o.host : "", o.cluster ? "cluster " + o.cluster : "",
        o.snapshot_count !== undefined ? o.snapshot_count + " snapshot" + (o.snapshot_count === 1 ? "" : "s") : ""]
        .filter(Boolean).join(" · ");
      const disks = (o.disks || []).map((d) => d.label + " " + d.size + " on " + (d.datastore || "?")).join("; ");
      return el("li", {}, el("span", { class: "obj", text: o.name }), " ", facts,
        disks ? el("span", { class: "disks", text: "Disks: " + disks }) : "");
    });
    if (blast.count > items.length) items.push(el("li", { class: "muted", text: "… " + blast.count + " objects in all" }));
    return el("div", { class: "affected-block" }, el("span", { class: "label", text: "Blast radius" }),
      el("ul", { class: "blast" }, ...items));
  }

  // N of M: how many distinct people approved, who, and why.
  function approvalsBlock(p) {
    if (!p.approvals_progress) return null;
    const needs = [p.approver_roles && p.approver_roles.length ? "approvers of role " + p.approver_roles.join(", ") : "",
      p.reason_required ? "a reason is required" : ""].filter(Boolean).join("; ");
    const list = (p.approvals || []).map((a) => el("li", {}, el("strong", { text: a.by }),
      a.reason ? el("span", { class: "why", text: ": " + a.reason }) : ""));
    return el("div", { class: "affected-block approvals" }, el("span", { class: "label", text: "Approvals" }),
      el("div", {}, el("span", { class: "progress", text: p.approvals_progress }), needs ? " · " + needs : "",
        list.length ? el("ul", {}, ...list) : ""));
  }

  function targetLine(p) {
    return el("div", { class: "target-line" },
      el("span", { class: "target-name", text: p.target }),
      el("span", { class: "target-host", text: p.target_host || "" }));
  }

  function stateBadge(p) {
    return el("span", { class: "badge state-" + p.state, text: STATE_LABELS[p.state] || p.state });
  }

  function pendingCard(p) {
    const focused = p.proposal_id === state.focus ? " focused" : "";
    const card = el("article", { class: "card proposal" + focused, "data-proposal": p.proposal_id, "data-state": p.state });
    const badge = p.state === "pending"
      ? el("span", { class: "badge " + (p.gated ? "gated" : "open"), text: p.gated ? "Blocked until approved" : "Not gated" })
      : stateBadge(p);
    card.append(
      el("header", { class: "card-head" }, targetLine(p), badge),
      el("p", { class: "meta" },
        el("span", { class: "tool", text: p.tool }),
        " · requested by ", el("span", { class: "caller", text: p.requested_by }),
        p.requested_via ? " over " + p.requested_via : "", " · ", when(p.created_at), " · ",
        el("span", { class: "proposal-id", text: "#" + p.proposal_id })),
      el("p", { class: "summary", text: p.summary }),
      el("div", { class: "affected-block" }, el("span", { class: "label", text: "Affects" }), affectedList(p)),
      ...[blastList(p), approvalsBlock(p)].filter(Boolean),
      gateNote(p),
    );
    const deadline = Date.now() + p.expires_in_seconds * 1000;
    const countdown = el("span", { class: "countdown", "data-deadline": String(deadline) });
    const footer = el("footer", { class: "card-foot" }, countdown);
    if (p.state === "pending") {
      const busy = state.busy.has(p.proposal_id);
      // the server's decision says what this viewer may do now; a click is decided again
      const why = p.decide_note || p.approve_note;
      const note = why ? el("span", { class: "decide-note", text: why }) : null;
      const deny = el("button", { type: "button", class: "button quiet deny", text: "Deny…",
        disabled: !p.can_decide || busy, title: p.decide_note || "" });
      const approve = el("button", { type: "button", class: "button primary approve", text: "Approve…",
        disabled: !p.can_approve || busy, title: p.approve_note || p.decide_note || "" });
      deny.addEventListener("click", () => decide(p, "deny"));
      approve.addEventListener("click", () => decide(p, "approve"));
      footer.append(...[el("span", { class: "spacer" }), note, deny, approve].filter(Boolean));
    } else {
      countdown.textContent = p.state === "executing" ? "running in vSphere…" : "approved, about to run";
      countdown.removeAttribute("data-deadline");
    }
    card.append(footer);
    return card;
  }

  function outcomeText(p) {
    const by = p.approved_by ? " by " + p.approved_by : "";
    const texts = {
      executed: p.approved_by ? "Approved by " + p.approved_by + " and executed" : "Confirmed by " + p.requested_by + " and executed",
      failed: "Failed" + (p.error && p.error.message ? ": " + p.error.message : ""),
      denied: "Denied" + by,
      expired: "Expired before anyone confirmed it",
      cancelled: "Withdrawn by " + p.requested_by,
      stale: "Not run, stale: " + (p.error && p.error.message ? p.error.message
        : "vSphere changed since it was proposed; make a fresh proposal if it is still wanted"),
      outcome_unknown: "Outcome unknown: the change was started but its result was not seen; check vSphere before retrying",
    };
    return texts[p.state] || STATE_LABELS[p.state] || p.state;
  }

  function recentCard(p) {
    const focused = p.proposal_id === state.focus ? " focused" : "";
    return el("article", { class: "card proposal decided" + focused, "data-proposal": p.proposal_id, "data-state": p.state },
      el("header", { class: "card-head" }, targetLine(p), stateBadge(p)),
      el("p", { class: "meta" },
        el("span", { class: "tool", text: p.tool }), " · requested by ",
        el("span", { class: "caller", text: p.requested_by }), " · ", when(p.decided_at || p.created_at), " · ",
        el("span", { class: "proposal-id", text: "#" + p.proposal_id })),
      el("p", { class: "summary", text: p.summary }),
      ...[approvalsBlock(p)].filter(Boolean),
      el("p", { class: "outcome", text: outcomeText(p) + (p.deny_reason ? ": " + p.deny_reason : "") }));
  }

  // A card is rebuilt only when what it shows changed, so buttons are not replaced under the pointer.
  function signature(p) {
    return [p.state, p.can_decide, p.decide_note, p.can_approve, p.approve_note, state.busy.has(p.proposal_id), p.approved_by, p.outcome,
      p.approvals_progress, JSON.stringify(p.blast_radius || null),
      p.proposal_id === state.focus].join("|");
  }

  function syncList(container, proposals, build) {
    const wanted = [];
    for (const p of proposals) {
      const key = container.id + ":" + p.proposal_id;
      const sig = signature(p);
      let entry = state.cards.get(key);
      if (!entry || entry.sig !== sig) {
        const card = build(p);
        if (entry) entry.card.replaceWith(card);
        entry = { card, sig };
        state.cards.set(key, entry);
      }
      wanted.push(entry.card);
    }
    const keep = new Set(wanted);
    for (const [key, entry] of state.cards) {
      if (key.startsWith(container.id + ":") && !keep.has(entry.card)) {
        entry.card.remove();
        state.cards.delete(key);
      }
    }
    wanted.forEach((card, index) => {
      if (container.children[index] !== card) container.insertBefore(card, container.children[index] || null);
    });
  }

  function renderProposals(proposals) {
    const open = proposals.filter((p) => ["pending", "approved", "executing"].includes(p.state));
    const done = proposals.filter((p) => !["pending", "approved", "executing"].includes(p.state))
      .sort((a, b) => (b.decided_at || b.created_at) - (a.decided_at || a.created_at));
    syncList($("pending-list"), open, pendingCard);
    syncList($("recent-list"), done, recentCard);
    $("pending-empty").hidden = open.length > 0;
    $("recent-empty").hidden = done.length > 0;
    const waiting = open.filter((p) => p.state === "pending").length;
    const count = $("pending-count");
    count.textContent = String(waiting);
    count.hidden = waiting === 0;
    tickCountdowns();
    showLinkedProposal(proposals);
  }

  // /ui#proposal=<id> (the link in notifications): that card alone (outlined; "Show all" brings the others
  // back), scrolled into view once.
  function showLinkedProposal(proposals) {
    const linked = Boolean(state.focus) && state.tab === "pending" && proposals.some((p) => p.proposal_id === state.focus);
    $("view-pending").classList.toggle("isolating", linked);
    $("focus-bar").hidden = !linked;
    if (linked) $("focus-id").textContent = state.focus;
    if (!state.focus || state.focusShown || state.tab !== "pending") return;
    const card = document.querySelector('.card[data-proposal="' + CSS.escape(state.focus) + '"]');
    if (card) {
      state.focusShown = true;
      requestAnimationFrame(() => card.scrollIntoView({ block: "center" }));
    } else if (!proposals.some((p) => p.proposal_id === state.focus)) {
      state.focusShown = true;
      toast("Proposal " + state.focus + " is not among the proposals you may see (it may be older than the list).", "error");
    }
  }

  function tickCountdowns() {
    for (const node of document.querySelectorAll(".countdown[data-deadline]")) {
      const left = (Number(node.dataset.deadline) - Date.now()) / 1000;
      node.textContent = left > 0 ? "expires in " + clock(left) : "expiring now";
      node.classList.toggle("soon", left < 30);
    }
  }

  async function loadProposals() {
    if (!state.me) return;
    try {
      renderProposals((await api("api/proposals")).proposals);
    } catch (error) {
      if (error.status !== 401) toast("Could not load proposals: " + error.message, "error");
    }
  }

  function fact(term, ...values) {
    return [el("dt", { text: term }), el("dd", {}, ...values)];
  }

  function confirmDialog(p, action) {
    const dialog = $("confirm-dialog");
    const approving = action === "approve";
    $("confirm-title").textContent = approving ? "Approve and run this action?" : "Deny this proposal?";
    clear($("confirm-target")).append(
      "On target ", el("strong", { class: "target-name", text: p.target }), " ",
      el("span", { class: "target-host", text: p.target_host || "" }));
    clear($("confirm-facts")).append(
      ...fact("Action", el("span", { class: "tool", text: p.tool })),
      ...fact("Summary", p.summary),
      ...fact("Affects", affectedList(p)),
      ...fact("Requested by", p.requested_by));
    const [have, need] = (p.approvals_progress || "0 of 1").split(" of ").map((n) => parseInt(n, 10));
    const last = !(need > 1) || have + 1 >= need;
    $("confirm-note").textContent = approving
      ? (last ? "It runs in vSphere as soon as you approve; this cannot be undone from here."
        : "Your approval is recorded (" + (have + 1) + " of " + need + "); it runs only when " +
          (need - have - 1) + " more different approver(s) approve it.")
      : "The agent is told a human denied it; nothing changes in vSphere.";
    $("confirm-reason-label").textContent = "Reason" + (p.reason_required ? " (required)" : " (optional)");
    const reason = $("confirm-reason");
    reason.value = "";
    reason.required = !!p.reason_required;
    const ok = $("confirm-ok");
    ok.textContent = (approving ? (last ? "Approve and run on " : "Approve on ") : "Deny on ") + p.target;
    ok.className = "button " + (approving ? "danger" : "primary");
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" ? { reason: reason.value } : null),
        { once: true });
      dialog.returnValue = "";
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  async function decide(p, action) {
    const chosen = await confirmDialog(p, action);
    if (!chosen) return;
    state.busy.add(p.proposal_id);
    await loadProposals();
    try {
      const answer = await api("api/proposals/" + encodeURIComponent(p.proposal_id) + "/" + action,
        { method: "POST", body: { reason: chosen.reason } });
      const waiting = answer && answer.result && answer.result.state === "pending";
      toast(action !== "approve" ? "Denied on " + p.target + "."
        : waiting ? "Approval recorded: " + answer.result.approvals_progress + "; nothing ran yet."
          : "Approved and executed on " + p.target + ".", "ok");
    } catch (error) {
      toast((action === "approve" ? "Not executed: " : "Not denied: ") + error.message, "error");
    } finally {
      state.busy.delete(p.proposal_id);
      await loadProposals();
    }
  }

  // ---------------------------------------------------------------- targets

  function table(columns, rows) {
    const head = el("tr", {}, ...columns.map((c) => el("th", { text: c.title, class: c.num ? "num" : undefined })));
    const body = rows.map((row) => el("tr", {}, ...columns.map((c) => {
      const value = c.value(row);
      const cell = el("td", { class: c.num ? "num" : c.cls, "data-label": c.title });
      cell.append(value instanceof Node ? value : String(value === null || value === undefined ? "—" : value));
      return cell;
    })));
    return el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...body)));
  }

  function errorLine(error) {
    return el("p", { class: "inline-error" },
      el("span", { class: "code", text: error.code || "error" }), " ", error.message || "");
  }

  function connectivity(row) {
    const ok = row.connectivity === "ok";
    return el("span", { class: "badge " + (ok ? "state-executed" : "state-failed"), text: ok ? "Connected" : "Unreachable" });
  }

  async function loadTargets() {
    const body = $("targets-body");
    clear(body).append(el("p", { class: "muted", text: "Asking every target…" }));
    try {
      const data = await api("api/targets");
      const columns = [
        { title: "Target", value: (t) => el("span", { class: "target-name", text: t.name }) },
        { title: "Address", value: (t) => el("span", { class: "mono", text: t.address || "(hidden for your role)" }) },
        { title: "Connectivity", value: connectivity },
        { title: "Product", value: (t) => t.product ? t.product + " " + (t.version || "") + (t.build ? " (build " + t.build + ")" : "") : null },
        { title: "Web approval", value: (t) => t.require_web_approval ? el("span", { class: "badge gated", text: "Required" }) : el("span", { class: "badge open", text: "Not gated" }) },
        { title: "Same vCenter as", value: (t) => (t.shares_instance_with || []).join(", ") || null },
        { title: "Last error", cls: "wrap", value: (t) => t.last_error ? errorLine(t.last_error) : null },
      ];
      clear(body).append(table(columns, data.targets || []));
      if (!(data.targets || []).length) body.append(el("p", { class: "empty", text: "Your role covers no target." }));
    } catch (error) {
      clear(body).append(errorLine(error));
    }
  }

  // ---------------------------------------------------------------- inventory

  const GB = (mb) => (mb === null || mb === undefined ? null : (mb / 1024).toFixed(1));
  const yesNo = (v) => (v === null || v === undefined ? null : v ? "yes" : "no");
  const INVENTORY_COLUMNS = {
    vms: ["vms", [
      { title: "Name", cls: "name", value: (r) => r.name },
      { title: "Power", value: (r) => r.power_state },
      { title: "Connection", value: (r) => r.connection_state },
      { title: "Host", value: (r) => r.host },
      { title: "CPU", num: true, value: (r) => r.cpu },
      { title: "Memory MB", num: true, value: (r) => r.memory_mb },
      { title: "Guest IP", value: (r) => r.guest_ip },
    ]],
    hosts: ["hosts", [
      { title: "Name", cls: "name", value: (r) => r.name },
      { title: "Cluster", value: (r) => r.cluster },
      { title: "Connection", value: (r) => r.connection_state },
      { title: "Power", value: (r) => r.power_state },
      { title: "Maintenance", value: (r) => yesNo(r.maintenance_mode) },
      { title: "Cores", num: true, value: (r) => r.cpu_cores },
      { title: "Memory MB", num: true, value: (r) => r.memory_mb },
      { title: "VMs", num: true, value: (r) => r.vm_count },
      { title: "Version", value: (r) => r.version },
    ]],
    clusters: ["clusters", [
      { title: "Name", cls: "name", value: (r) => r.name },
      { title: "Datacenter", value: (r) => r.datacenter },
      { title: "Hosts", num: true, value: (r) => r.host_count },
      { title: "Datastores", num: true, value: (r) => r.datastore_count },
      { title: "DRS", value: (r) => yesNo(r.drs_enabled) },
      { title: "HA", value: (r) => yesNo(r.ha_enabled) },
      { title: "Status", value: (r) => r.overall_status },
    ]],
    datastores: ["datastores", [
      { title: "Name", cls: "name", value: (r) => r.name },
      { title: "Type", value: (r) => r.type },
      { title: "Capacity GB", num: true, value: (r) => GB(r.capacity_mb) },
      { title: "Free GB", num: true, value: (r) => GB(r.free_mb) },
      { title: "Accessible", value: (r) => yesNo(r.accessible) },
      { title: "Maintenance", value: (r) => r.maintenance_mode },
      { title: "VMs", num: true, value: (r) => r.vm_count },
    ]],
  };

  function renderInventory() {
    const body = clear($("inventory-body"));
    const data = state.inventory;
    if (!data) return;
    const [key, columns] = INVENTORY_COLUMNS[data.kind];
    const needle = $("inventory-filter").value.trim().toLowerCase();
    for (const [target, answer] of Object.entries(data.targets || {})) {
      const section = el("section", { class: "inventory-target", "data-target": target });
      const head = el("h2", { class: "target-line" }, el("span", { class: "target-name", text: target }));
      section.append(head);
      if (answer.error) {
        section.append(errorLine(answer.error));
      } else {
        const rows = ((answer.ok || {})[key] || []).filter((r) => !needle || String(r.name).toLowerCase().includes(needle));
        head.append(el("span", { class: "muted", text: rows.length + " shown" }));
        section.append(rows.length ? table(columns, rows) : el("p", { class: "empty", text: "None." }));
      }
      body.append(section);
    }
  }

  async function loadInventory() {
    for (const button of document.querySelectorAll("#inventory-kinds button")) {
      button.classList.toggle("active", button.dataset.kind === state.inventoryKind);
    }
    const body = $("inventory-body");
    clear(body).append(el("p", { class: "muted", text: "Reading every target…" }));
    try {
      state.inventory = await api("api/inventory/" + state.inventoryKind);
      renderInventory();
    } catch (error) {
      clear(body).append(errorLine(error));
    }
  }

  // ---------------------------------------------------------------- audit

  async function loadChain() {
    const node = $("chain-status");
    node.className = "chain";
    node.textContent = "Checking the hash chain…";
    try {
      const report = await api("api/audit/verify");
      if (report.ok) {
        node.className = "chain ok";
        node.textContent = "Hash chain verifies: " + report.rows + " rows" +
          (report.rows ? " (seq " + report.first_seq + "–" + report.last_seq + ")" : "") +
          (report.starts_after_rotation ? ", starting after older rotated files were removed" : "") + ".";
      } else {
        const fault = report.first_broken_line || report.torn_last_line;
        node.className = "chain broken";
        node.textContent = "Hash chain does NOT verify: " + fault.file + " line " + fault.line + ": " +
          fault.reason + " — " + fault.detail + (report.problems > 1 ? " (" + report.problems + " lines in all)" : "");
      }
    } catch (error) {
      node.className = "chain broken";
      node.textContent = "Could not check the chain: " + error.message;
    }
  }

  // What happened, in words; the deciding rule and reason are on hover, never in place of the outcome.
  const PHASE_OUTCOMES = {
    approved: "approved", denied: "denied", expired: "expired",
    cancelled: "cancelled", dry_run: "dry run: nothing changed", executed: "ok", call: "ok",
    executing: "started (intent recorded)", web_sign_in: "signed in", web_sign_out: "signed out",
    token_created: "created", notification_failed: "not delivered", config_reload: "loaded",
    identity_verified: "identity verified", token_revoked: "revoked",
  };

  // A row's phase as a reader should take it: a call the gateway refused (phase "denied" with an error
  // code: not_found, approval_required, forbidden...) is "refused", never "denied", which a human's
  // decision on a proposal reads as.
  function auditPhase(row) {
    if (row.phase === "denied" && row.error_code) return "refused";
    return row.phase || "-";
  }

  function auditOutcome(row) {
    const decision = row.decision || {};
    const why = [decision.rule ? "rule: " + decision.rule : "", decision.reason || ""].filter(Boolean).join(" — ");
    if (row.error_code) return el("span", { class: "bad", text: row.error_code, title: why || undefined });
    let text = row.outcome || PHASE_OUTCOMES[row.phase] || null;
    if (row.phase === "proposed") {
      text = decision.require_approval ? "waiting for approval" : "waiting for confirmation";
    } else if (row.phase === "denied" && row.caller) {
      text = "denied by " + row.caller;
    } else if (row.phase === "elicited") {
      text = "asked at the client: " + (row.answer || "?");
    } else if (row.phase === "retry") {
      text = "retry answered from the first call (" + (row.outcome || "?") + ")";
    } else if (row.phase === "approval") {
      text = "approved by " + (row.caller || "?") + (row.approvals ? " (" + row.approvals + ")" : "");
    } else if (row.phase === "token_refused") {
      text = "token refused: " + (row.reason || "?") + (row.count > 1 ? " ×" + row.count : "");
    }
    if (text === null) text = "recorded";
    return why ? el("span", { text, title: why }) : text;
  }

  // The audit table: each row's JSON opens in a row of its own, across the whole table.
  function auditTable(columns, rows) {
    const wrap = table(columns, rows);
    wrap.classList.add("audit-table");
    const trs = wrap.querySelectorAll("tbody tr");
    trs.forEach((tr, index) => {
      const button = el("button", { type: "button", class: "button quiet row-toggle", text: "show", "aria-expanded": "false" });
      tr.lastChild.append(button);
      button.addEventListener("click", () => {
        const open = tr.nextSibling && tr.nextSibling.classList && tr.nextSibling.classList.contains("row-json");
        if (open) {
          tr.nextSibling.remove();
          button.textContent = "show";
          button.setAttribute("aria-expanded", "false");
          return;
        }
        const cell = el("td", {}, el("pre", { class: "row-json-text", text: JSON.stringify(rows[index], null, 2) }));
        cell.colSpan = columns.length;
        tr.after(el("tr", { class: "row-json" }, cell));
        button.textContent = "hide";
        button.setAttribute("aria-expanded", "true");
      });
    });
    return wrap;
  }

  async function loadAudit() {
    loadChain();
    const params = new URLSearchParams();
    for (const [name, value] of new FormData($("audit-filters"))) {
      if (String(value).trim()) params.set(name, String(value).trim());
    }
    const body = $("audit-body");
    clear(body).append(el("p", { class: "muted", text: "Reading the log…" }));
    try {
      const data = await api("api/audit?" + params.toString());
      const rows = (data.rows || []).slice().reverse();
      const columns = [
        { title: "Time (UTC)", cls: "mono", value: (r) => (r.ts || "").replace("T", " ").replace("Z", "") },
        { title: "Seq", num: true, value: (r) => r.seq },
        { title: "Phase", value: (r) => el("span", { class: "phase phase-" + auditPhase(r), text: auditPhase(r),
          title: auditPhase(r) !== r.phase ? "logged as " + r.phase : undefined }) },
        { title: "Caller", value: (r) => r.caller },
        { title: "Surface", value: (r) => r.surface },
        { title: "Tool", value: (r) => r.tool },
        { title: "Target", value: (r) => r.target },
        { title: "Outcome", value: auditOutcome },
        { title: "Row", value: () => "" },
      ];
      clear(body).append(auditTable(columns, rows));
      if (!rows.length) body.append(el("p", { class: "empty", text: "No rows match." }));
    } catch (error) {
      clear(body).append(errorLine(error));
    }
  }

  // ---------------------------------------------------------------- agents

  const WINDOW_LABELS = { "1h": "the last hour", "24h": "the last 24 hours", "7d": "the last 7 days" };

  // Calls per slot as a small line chart: the page's own SVG template, its points set here from the
  // API's numbers (no library, nothing parsed; the caller's name goes in as text only).
  function callChart(entry, slotSeconds) {
    const series = entry.series || [];
    const width = Math.max(1, series.length - 1);
    const height = 24;
    const top = Math.max(1, ...series);
    const points = series.map((count, i) => i + "," + (height - (count / top) * (height - 2) - 1).toFixed(2)).join(" ");
    const minutes = Math.round(slotSeconds / 60);
    const step = minutes >= 60 ? (minutes / 60) + " h" : minutes + " min";
    const label = entry.calls + " calls by " + entry.caller + ", per " + step + "; at most " + top + " in one";
    const chart = $("chart-template").content.firstElementChild.cloneNode(true);
    chart.setAttribute("viewBox", "0 0 " + width + " " + height);
    chart.setAttribute("aria-label", label);
    chart.setAttribute("data-points", String(series.length));
    chart.querySelector("title").textContent = label;
    chart.querySelector("polygon").setAttribute("points", "0," + height + " " + points + " " + width + "," + height);
    chart.querySelector("polyline").setAttribute("points", points);
    return chart;
  }

  function refusalText(entry) {
    const codes = Object.entries(entry.refusals || {});
    if (!codes.length) return "0";
    return codes.map(([code, count]) => code + " " + count).join(", ");
  }

  function waitText(entry) {
    if (entry.queue_wait_p50_ms === null || entry.queue_wait_p50_ms === undefined) return "—";
    // the API's percentiles are histogram bounds: the wait was at most this long
    return "≤" + entry.queue_wait_p50_ms + " / ≤" + entry.queue_wait_p95_ms + " ms";
  }

  // A caller's name opens the Audit tab filtered to that caller.
  function callerLink(entry) {
    const button = el("button", { type: "button", class: "link caller-link", text: entry.caller,
      title: "Show " + entry.caller + "'s rows in the Audit tab", "data-caller": entry.caller });
    button.addEventListener("click", () => {
      const form = $("audit-filters");
      for (const name of ["phase", "target", "tool"]) form.elements[name].value = "";
      form.elements.caller.value = entry.caller;
      location.hash = "#audit";
    });
    return el("span", { class: "caller-cell" }, button,
      entry.kind ? el("span", { class: "pill kind", text: entry.kind }) : null);
  }

  async function loadAgents() {
    const chosen = state.agentsWindow;
    for (const button of document.querySelectorAll("#agents-windows button")) {
      button.classList.toggle("active", button.dataset.window === chosen);
      button.setAttribute("aria-pressed", button.dataset.window === chosen ? "true" : "false");
    }
    const body = $("agents-body");
    clear(body).append(el("p", { class: "muted", text: "Counting…" }));
    try {
      const data = await api("api/agents?window=" + encodeURIComponent(chosen));
      if (state.tab !== "agents" || state.agentsWindow !== chosen) return;
      const callers = data.callers || [];
      const columns = [
        { title: "Caller", value: callerLink },
        { title: "Calls", num: true, value: (e) => e.calls },
        { title: "Calls over time", cls: "chart-cell", value: (e) => callChart(e, data.slot_seconds) },
        { title: "Refused", value: (e) => el("span", { class: e.refused ? "bad" : undefined, text: refusalText(e) }) },
        { title: "Errors", num: true, value: (e) => e.errors },
        { title: "Rate-limited", num: true, value: (e) => e.rate_limited },
        { title: "Busy", num: true, value: (e) => e.busy },
        { title: "Queue wait p50 / p95", value: waitText },
        { title: "Open proposals", num: true, value: (e) => e.open_proposals },
        { title: "Last call", value: (e) => when(e.last_call) },
      ];
      const wrap = table(columns, callers);
      wrap.classList.add("agents-table");
      wrap.querySelectorAll("tbody tr").forEach((tr, index) => tr.setAttribute("data-caller", callers[index].caller));
      clear(body).append(wrap);
      if (!callers.length) body.append(el("p", { class: "empty", text: "No calls in " + WINDOW_LABELS[chosen] + "." }));
    } catch (error) {
      clear(body).append(errorLine(error));
    }
  }

  // ---------------------------------------------------------------- start

  async function boot() {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    $("targets-refresh").addEventListener("click", loadTargets);
    $("focus-all").addEventListener("click", () => { location.hash = "#pending"; });
    $("audit-filters").addEventListener("submit", (event) => { event.preventDefault(); loadAudit(); });
    $("inventory-filter").addEventListener("input", renderInventory);
    for (const button of document.querySelectorAll("#inventory-kinds button")) {
      button.addEventListener("click", () => { state.inventoryKind = button.dataset.kind; loadInventory(); });
    }
    for (const button of document.querySelectorAll("#agents-windows button")) {
      button.addEventListener("click", () => { state.agentsWindow = button.dataset.window; loadAgents(); });
    }
    window.addEventListener("hashchange", route);
    try {
      const session = await api("api/session");
      if (session.signed_in) signedIn(session);
      else { signInWays(session); showSignIn("", session.sign_in_role || null); }
    } catch (error) {
      showSignIn("The gateway could not be reached: " + error.message);
    }
  }

  boot();
})();
