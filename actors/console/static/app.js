// The sojourn console (docs/console.md). Preact + htm, vendored: no build step.
// Every request goes to this gateway: the session cookie (HttpOnly) authenticates it, and a
// request that changes anything carries the session's CSRF token. No token is ever put in a URL.
import { html, render, useState, useEffect, useRef, useCallback } from "./vendor/htm-preact-standalone.js";

// --- the API ---------------------------------------------------------------------------------

let session = null;

class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.detail || body.title)) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    if (session) headers["X-CSRF-Token"] = session.csrf;
  }
  const r = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (r.status === 401 && path !== "/ui/session") { session = null; rerender(); }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

const enc = encodeURIComponent;
const may = (action) => !!session && session.actions.includes(action);

// --- formatting ------------------------------------------------------------------------------

function dur(s) {
  if (s === null || s === undefined) return "";
  if (s < 0.001) return "<1 ms";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
}
const now = () => Date.now() / 1000;
const ago = (t) => (t ? `${dur(Math.max(now() - t, 0))} ago` : "");
function until(t) {
  if (!t) return "";
  const d = t - now();
  return d >= 0 ? `in ${dur(d)}` : `${dur(-d)} overdue`;
}
const clock = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "");
const usd = (v) => (v ? `$${v < 0.01 ? v.toFixed(6) : v.toFixed(4)}` : "$0");
const Badge = ({ s }) => (s ? html`<span class=${`badge s-${s}`} data-status=${s}>${s}</span>` : null);

// --- routing (the hash) ----------------------------------------------------------------------

function route() {
  const h = location.hash.replace(/^#/, "") || "/runs";
  const [path, query] = h.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(query || "") };
}

let rerender = () => {};

// --- sign-in ---------------------------------------------------------------------------------

function SignIn({ onSignedIn }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState("");
  const submit = async (e) => {
    e.preventDefault();
    setError("");
    try {
      session = await api("POST", "/ui/session", { token });
      setToken("");
      onSignedIn();
    } catch (err) { setError(err.message); }
  };
  return html`<form class="card signin" onSubmit=${submit} data-test="signin">
    <h1>sojourn console</h1>
    <p class="muted">Sign in with one of this gateway's bearer tokens. It is sent once, in this
      form's body; the browser then keeps an HttpOnly session cookie.</p>
    <input type="password" name="token" autocomplete="off" placeholder="bearer token"
      value=${token} onInput=${(e) => setToken(e.target.value)} />
    <button class="primary" type="submit">Sign in</button>
    ${error && html`<p class="error" data-test="signin-error">${error}</p>`}
  </form>`;
}

// --- a confirmation dialog and the result of an action ----------------------------------------

function useAction() {
  const [pending, setPending] = useState(null); // {title, text, run}
  const [result, setResult] = useState(null); // {ok, text}
  const ask = (title, text, run) => setPending({ title, text, run });
  const dialog = pending && html`<div class="dialog-back">
    <div class="dialog" role="dialog" data-test="confirm">
      <h2>${pending.title}</h2><p>${pending.text}</p>
      <div class="buttons">
        <button onClick=${() => setPending(null)} data-test="confirm-no">Cancel</button>
        <button class="primary" data-test="confirm-yes" onClick=${async () => {
          const p = pending; setPending(null);
          try { setResult({ ok: true, text: await p.run() }); }
          catch (err) { setResult({ ok: false, text: `${p.title} refused: ${err.message}` }); }
        }}>Confirm</button>
      </div></div></div>`;
  const banner = result && html`<div class=${`result ${result.ok ? "ok" : "bad"}`} data-test="result">${result.text}</div>`;
  return { ask, dialog, banner };
}

// --- the runs listing --------------------------------------------------------------------------

const STATUSES = ["pending", "running", "waiting", "suspended", "completed", "failed", "cancelled"];
const LIVENESS = ["pending", "running", "waiting", "suspended", "stalled", "orphaned", "overdue", "wedged", "ended"];
const SINCE = { "": "any time", 3600: "last hour", 86400: "last day", 604800: "last week" };

function Runs({ query }) {
  const f = Object.fromEntries(["agent", "status", "liveness", "schedule", "parent", "since"].map((k) => [k, query.get(k) || ""]));
  const [page, setPage] = useState({ runs: [], next: null });
  const [cursors, setCursors] = useState([null]);
  const [error, setError] = useState("");
  const cursor = cursors[cursors.length - 1];
  const key = JSON.stringify(f);
  useEffect(() => { setCursors([null]); }, [key]);
  useEffect(() => {
    let live = true;
    const load = async () => {
      const q = new URLSearchParams({ limit: "50" });
      for (const [k, v] of Object.entries(f)) if (v) q.set(k, k === "since" ? String(Math.floor(now() - Number(v))) : v);
      if (cursor) q.set("after", cursor);
      try { const p = await api("GET", `/v1/runs?${q}`); if (live) { setPage(p); setError(""); } }
      catch (err) { if (live) setError(err.message); }
    };
    load();
    const timer = setInterval(load, 2000); // runs move without a reload
    return () => { live = false; clearInterval(timer); };
  }, [key, cursor]);
  const set = (k, v) => {
    const q = new URLSearchParams(query); v ? q.set(k, v) : q.delete(k);
    location.hash = `#/runs?${q}`;
  };
  const sel = (k, options) => html`<select data-filter=${k} value=${f[k]} onChange=${(e) => set(k, e.target.value)}>
    <option value="">any</option>${options.map((o) => html`<option value=${o}>${o}</option>`)}</select>`;
  const text = (k) => html`<input data-filter=${k} value=${f[k]} size="14" onChange=${(e) => set(k, e.target.value.trim())} />`;
  return html`<h1>Runs</h1>
    <div class="filters">
      <label>agent ${text("agent")}</label><label>status ${sel("status", STATUSES)}</label>
      <label>liveness ${sel("liveness", LIVENESS)}</label><label>schedule ${text("schedule")}</label>
      <label>parent ${text("parent")}</label>
      <label>updated <select data-filter="since" value=${f.since} onChange=${(e) => set("since", e.target.value)}>
        ${Object.entries(SINCE).map(([v, t]) => html`<option value=${v}>${t}</option>`)}</select></label>
    </div>
    ${error && html`<p class="error">${error}</p>`}
    <table data-test="runs"><thead><tr><th>run</th><th>agent</th><th>status</th><th>liveness</th>
      <th>waiting on / step</th><th>steps</th><th>spent</th><th>updated</th></tr></thead>
    <tbody>${page.runs.map((v) => html`<tr key=${v.run_id} data-run-id=${v.run_id}>
      <td><a class="mono" href=${`#/run/${enc(v.run_id)}`}>${v.run_id}</a>${v.priority && v.priority !== 3 ? html` <span class="tag" data-test="priority" title="priority">p${v.priority}</span>` : ""}</td><td>${v.agent}</td>
      <td><${Badge} s=${v.status} /></td><td><${Badge} s=${v.liveness} /></td>
      <td class="mono">${v.waiting_on.join(", ") || v.step || ""}</td><td>${v.steps_done}</td>
      <td>${usd(v.spent_usd)}${v.spent_tokens ? ` · ${v.spent_tokens} tok` : ""}</td>
      <td title=${clock(v.updated_at)}>${ago(v.updated_at)}</td></tr>`)}</tbody></table>
    ${!page.runs.length && !error && html`<p class="muted">No runs match.</p>`}
    <div class="pager">
      <button disabled=${cursors.length < 2} onClick=${() => setCursors(cursors.slice(0, -1))}>‹ newer</button>
      <button disabled=${!page.next} onClick=${() => setCursors([...cursors, page.next])}>older ›</button>
      <span class="live">live</span></div>`;
}

// --- the approvals inbox ---------------------------------------------------------------------

function Approvals() {
  const [inbox, setInbox] = useState(null);
  const [error, setError] = useState("");
  useEffect(() => {
    let live = true;
    const load = () => api("GET", "/ui/api/approvals").then((a) => live && (setInbox(a.approvals), setError(""))).catch((e) => live && setError(e.message));
    load();
    const timer = setInterval(load, 3000);
    return () => { live = false; clearInterval(timer); };
  }, []);
  return html`<h1>Approvals</h1>
    <p class="muted">Every run waiting on an approval (ctx.approval), oldest first.</p>
    ${error && html`<p class="error">${error}</p>`}
    <table data-test="approvals"><thead><tr><th>run</th><th>agent</th><th>approval</th><th>waiting</th><th>deadline</th></tr></thead>
    <tbody>${(inbox || []).map((a) => html`<tr key=${a.run_id} data-run-id=${a.run_id}>
      <td><a class="mono" href=${`#/run/${enc(a.run_id)}`}>${a.run_id}</a></td><td>${a.agent}</td>
      <td class="mono">${a.approval}</td><td title=${clock(a.waiting_since)}>${ago(a.waiting_since)}</td>
      <td title=${clock(a.deadline)}>${until(a.deadline)}</td></tr>`)}</tbody></table>
    ${inbox && !inbox.length && html`<p class="muted">Nothing waits on an approval.</p>`}`;
}

// --- a run -------------------------------------------------------------------------------------

const GAP = 60; // seconds of nothing happening drawn as one compressed row

function Attempt({ a, prev }) {
  const restarted = prev && prev.outcome === "in_doubt" && a.writer && prev.writer !== a.writer;
  const what = a.outcome === "completed" ? dur(a.duration)
    : a.outcome === "failed" ? `failed after ${dur(a.duration)}${a.error ? `: ${a.error.type}: ${a.error.message}` : ""}${a.retry_at ? ` · retry ${until(a.retry_at)}` : ""}`
    : a.outcome === "in_doubt" ? "in doubt: its worker was lost mid-step" : "running…";
  return html`<span class=${`attempt ${a.outcome}`} data-test="attempt" data-outcome=${a.outcome}
    title=${`written by ${a.writer}`}>#${a.attempt} ${what}${restarted ? ` · restarted on ${a.writer.split(".")[0]}` : ""}</span>`;
}

function Usage({ u }) {
  if (!u) return null;
  return html`<div class="usage" data-test="usage">${u.model ? `${u.model} · ` : ""}${u.input_tokens || 0} in + ${u.output_tokens || 0} out tokens · <span data-test="cost">${usd(u.usd || 0)}</span></div>`;
}

function itemBody(i, longest) {
  switch (i.kind) {
    case "start": return html`started ${i.by ? `by ${i.by}` : ""} ${i.detail}`;
    case "step": {
      const last = i.attempts[i.attempts.length - 1];
      const total = i.end ? i.end - i.at : now() - i.at;
      return html`<div><b class="mono">${i.name}</b>${i.step_kind && i.step_kind !== "step" ? html` <span class="badge">${i.step_kind}</span>` : ""}
        <span class="muted" data-test="duration"> ${last.outcome === "running" ? `running ${dur(total)}` : dur(total)}</span></div>
        <div>${i.attempts.map((a, n) => html`<${Attempt} a=${a} prev=${i.attempts[n - 1]} />`)}</div>
        <${Usage} u=${i.usage} />
        <div class="bar" style=${{ width: `${Math.max(2, Math.min(100, (100 * total) / longest))}%` }}></div>`;
    }
    case "wait": {
      const ended = i.end ? ((i.name || "").startsWith("limit:") ? "its slot began" : i.outcome === "signal" ? `ended by ${i.signal}${i.sent_by ? ` from ${i.sent_by}${i.sender_verified ? " (authenticated)" : ""}` : ""}` : i.outcome === "timeout" ? "timed out" : `ended (${i.outcome})`) : "waiting";
      return html`<div>for <span class="mono">${(i.waits_for || []).join(", ") || i.name}</span> · ${ended}${i.end ? ` after ${dur(i.end - i.at)}` : ""}
        ${i.deadline ? html` · deadline <span title=${clock(i.deadline)}>${i.end ? clock(i.deadline) : until(i.deadline)}</span>` : ""}</div>`;
    }
    case "signal": return html`<span class="mono">${i.name}</span> from <b data-test="sender">${i.sent_by || "unknown"}</b> ${i.sender_verified ? "(authenticated)" : i.sender_verified === false ? "(not authenticated)" : ""}`;
    case "child": return html`started <a class="mono" href=${`#/run/${enc(i.child_run_id)}`}>${i.child_run_id}</a> (${i.agent})`;
    case "suspended": return html`<b>${i.reason}</b>${i.limit ? ` · limit ${i.limit}` : ""} · ${i.detail}`;
    case "resumed": return html`resumed${i.by ? ` by ${i.by}` : ""} ${i.detail}`;
    case "budget": return html`budget set to ${i.detail}${i.by ? ` by ${i.by}` : ""}`;
    case "cancel": return html`${i.terminate ? "terminate" : "cancel"} requested${i.by ? ` by ${i.by}` : ""} ${i.detail}`;
    case "refusal": return html`approval ${i.name}: decision from ${i.by} refused (${i.detail})`;
    case "spend": return html`spent ${usd(i.usd)}${i.tokens ? ` and ${i.tokens} tokens` : ""}`;
    case "end": return html`<${Badge} s=${i.status} /> ${i.detail}`;
    default: return i.kind;
  }
}

function Timeline({ t }) {
  const steps = t.items.filter((i) => i.kind === "step");
  const longest = Math.max(0.001, ...steps.map((i) => (i.end || now()) - i.at));
  const rows = [];
  let last = t.started_at;
  let prev = null;
  for (const i of t.items) {
    if (i.at - last > GAP) {
      // Drawn as one row, not to scale: what was open meanwhile says why nothing happened.
      const why = !prev ? "" : prev.kind === "wait" ? ` waiting for ${(prev.waits_for || []).join(", ")}`
        : prev.kind === "step" ? ` in step ${prev.name}` : "";
      rows.push(html`<li class="gap" data-test="gap"><span class="t"></span><span class="k">idle</span><span>⋯ ${dur(i.at - last)}${why} (compressed)</span></li>`);
    }
    rows.push(html`<li class=${`k-${i.kind}`} data-kind=${i.kind} data-test="item">
      <span class="t" title=${clock(i.at)}>+${dur(i.at - t.started_at)}</span>
      <span class="k">${i.kind}</span><div>${itemBody(i, longest)}</div></li>`);
    last = i.at;
    prev = i;
  }
  const open = t.ended_at ? null : t.items[t.items.length - 1];
  if (open && now() - last > GAP) {
    rows.push(html`<li class="gap" data-test="gap"><span class="t"></span><span class="k">now</span><span>⋯ ${dur(now() - last)} since, ${t.waiting_on.length ? `waiting on ${t.waiting_on.join(", ")}` : t.status}</span></li>`);
  }
  return html`<ul class="timeline" data-test="timeline">${rows}</ul>
    ${t.omitted ? html`<p class="muted">${t.omitted} earlier items are left out: the history has them.</p>` : ""}`;
}

function Spend({ t }) {
  const rows = t.spend.filter((s) => s.used || s.granted !== null);
  return html`<table class="spend" data-test="spend"><thead><tr><th>budget</th><th>used</th><th>limit</th></tr></thead>
    <tbody>${rows.map((s) => {
      const share = s.granted ? Math.min(1, s.used / s.granted) : 0;
      const shown = s.limit === "usd" ? usd(s.used) : s.limit === "wall_seconds" ? dur(s.used) : s.used;
      return html`<tr data-limit=${s.limit}><td>${s.limit}</td><td>${shown}</td>
        <td>${s.granted === null || s.granted === undefined ? html`<span class="muted">none</span>` : s.limit === "usd" ? usd(s.granted) : s.granted}
        ${s.granted ? html`<div class="meter"><div class=${share > 0.9 ? "high" : ""} style=${{ width: `${100 * share}%` }}></div></div>` : ""}</td></tr>`;
    })}</tbody></table>`;
}

function Actions({ t, onDone }) {
  const { ask, dialog, banner } = useAction();
  const [signal, setSignal] = useState("");
  const [payload, setPayload] = useState("");
  const [limit, setLimit] = useState("usd");
  const [amount, setAmount] = useState("");
  const id = enc(t.run_id);
  const ended = ["completed", "failed", "cancelled"].includes(t.status);
  const approvals = t.waiting_on.filter((w) => w.startsWith("signal:approval.")).map((w) => w.slice(7));
  const act = (title, text, run) => ask(title, text, async () => { const r = await run(); onDone(); return r; });
  const decide = (name, approve) => act(approve ? "Approve" : "Deny", `${approve ? "Approve" : "Deny"} ${name.slice(9)} for run ${t.run_id}, as ${session.name || "this gateway"}?`,
    async () => { const r = await api("POST", `/v1/runs/${id}/signals/${enc(name)}`, { approve, by: session.name }); return `${approve ? "Approved" : "Denied"}: signal ${r.signal} recorded (${r.signal_id}).`; });
  if (ended) return html`${banner}<p class="muted">The run has ended: nothing to do.</p>`;
  return html`${dialog}${banner}
    ${may("signal") && approvals.map((name) => html`<div class="group" data-test="approval">
      <span>Approval <b class="mono">${name.slice(9)}</b></span>
      <button class="good" data-test="approve" onClick=${() => decide(name, true)}>Approve</button>
      <button class="danger" data-test="deny" onClick=${() => decide(name, false)}>Deny</button></div>`)}
    ${may("signal") && html`<div class="group"><input placeholder="signal name" size="14" value=${signal} onInput=${(e) => setSignal(e.target.value)} />
      <input placeholder="JSON payload" size="14" value=${payload} onInput=${(e) => setPayload(e.target.value)} />
      <button disabled=${!signal} onClick=${() => act("Send signal", `Send ${signal} to ${t.run_id}?`, async () => {
        const r = await api("POST", `/v1/runs/${id}/signals/${enc(signal)}`, payload ? JSON.parse(payload) : null);
        return `Signal ${r.signal} recorded (${r.signal_id}).`; })}>Send signal</button></div>`}
    <div class="group">
      ${may("cancel") && html`<button data-test="cancel" onClick=${() => act("Cancel", `Cancel run ${t.run_id}? Its compensation runs.`, async () => { await api("POST", `/v1/runs/${id}/cancel`, { reason: "from the console" }); return "Cancel requested."; })}>Cancel</button>`}
      ${may("operate") && html`<button class="danger" data-test="terminate" onClick=${() => act("Terminate", `Terminate run ${t.run_id}? No compensation runs.`, async () => { await api("POST", `/v1/runs/${id}/terminate`, { reason: "from the console" }); return "Terminate requested."; })}>Terminate</button>`}
      ${may("operate") && t.status === "suspended" && html`<button data-test="resume" onClick=${() => act("Resume", `Resume run ${t.run_id}?`, async () => { await api("POST", `/v1/runs/${id}/resume`, { note: "from the console" }); return "Resume requested."; })}>Resume</button>`}
    </div>
    ${may("operate") && html`<div class="group" data-test="budget"><select value=${limit} onChange=${(e) => setLimit(e.target.value)}>
      ${t.spend.map((s) => html`<option value=${s.limit}>${s.limit}</option>`)}</select>
      <input placeholder="new limit" size="8" value=${amount} onInput=${(e) => setAmount(e.target.value)} />
      <button disabled=${!(Number(amount) >= 0 && amount !== "")} onClick=${() => act("Raise budget", `Set ${limit} to ${amount} for ${t.run_id}?`, async () => {
        await api("POST", `/v1/runs/${id}/budget`, { [limit]: Number(amount) }); return `Budget ${limit} set to ${amount}.`; })}>Set budget</button></div>`}`;
}

function Output({ runId }) {
  const [text, setText] = useState("");
  const [progress, setProgress] = useState(null);
  useEffect(() => {
    setText(""); setProgress(null);
    // EventSource resumes by itself with Last-Event-ID: nothing is read twice after a drop.
    const es = new EventSource(`/v1/runs/${enc(runId)}/stream`);
    es.addEventListener("chunk", (e) => {
      const c = JSON.parse(e.data);
      if (c.kind === "progress") setProgress(c.value); else setText((t) => (t + (c.text || "")).slice(-200000));
    });
    es.addEventListener("end", () => es.close());
    return () => es.close();
  }, [runId]);
  if (!text && progress === null) return html`<p class="muted">No output.</p>`;
  return html`${progress !== null && html`<p>progress: <code>${JSON.stringify(progress)}</code></p>`}<div class="output" data-test="output">${text}</div>`;
}

function Run({ runId }) {
  const [t, setT] = useState(null);
  const [error, setError] = useState("");
  const [live, setLive] = useState(false);
  const busy = useRef(false);
  const again = useRef(false);
  const load = useCallback(async () => {
    if (busy.current) { again.current = true; return; }
    busy.current = true;
    try { setT(await api("GET", `/ui/api/runs/${enc(runId)}/timeline`)); setError(""); }
    catch (err) { setError(err.message); }
    finally { busy.current = false; if (again.current) { again.current = false; load(); } }
  }, [runId]);
  useEffect(() => {
    setT(null); load();
    // The run's views as they change (the read side); each newer one reloads the timeline.
    const es = new EventSource(`/v1/runs/${enc(runId)}/events`);
    es.onopen = () => setLive(true);
    es.onerror = () => setLive(false);
    es.addEventListener("view", () => load());
    es.addEventListener("end", () => { load(); es.close(); setLive(false); });
    const backup = setInterval(load, 5000); // also without a projector
    return () => { es.close(); clearInterval(backup); };
  }, [runId]);
  if (error && !t) return html`<p class="error">${error}</p>`;
  if (!t) return html`<p class="muted">Loading ${runId}…</p>`;
  const link = (id) => html`<a class="mono" href=${`#/run/${enc(id)}`}>${id}</a>`;
  return html`<h1><span class="mono" data-test="run-id">${t.run_id}</span> <span data-test="run-status"><${Badge} s=${t.status} /></span>${t.liveness && t.liveness !== t.status ? html` <span data-test="run-liveness" title="liveness"><${Badge} s=${t.liveness} /></span>` : ""}
      <span class=${`live ${live ? "" : "off"}`}>${live ? "● live" : "○ polling"}</span></h1>
    <div class="cols"><div>
      <div class="card"><dl class="facts">
        <dt>agent</dt><dd>${t.agent}</dd><dt>started</dt><dd>${clock(t.started_at)}</dd>
        ${t.ended_at ? html`<dt>ended</dt><dd>${clock(t.ended_at)} (${dur(t.ended_at - t.started_at)})</dd>` : html`<dt>updated</dt><dd>${ago(t.updated_at)}</dd>`}
        ${t.waiting_on.length ? html`<dt>waiting on</dt><dd class="mono" data-test="waiting-on">${t.waiting_on.join(", ")}${t.deadline ? ` · deadline ${until(t.deadline)} (${clock(t.deadline)})` : ""}</dd>` : ""}
        ${t.suspended_reason ? html`<dt>suspended</dt><dd><b>${t.suspended_reason}</b> · ${t.suspended_detail}</dd>` : ""}
        ${t.error ? html`<dt>error</dt><dd class="error">${t.error.type}: ${t.error.message}</dd>` : ""}
        ${t.parent_run_id ? html`<dt>parent</dt><dd>${link(t.parent_run_id)}</dd>` : ""}
        ${t.previous_run_id ? html`<dt>continues</dt><dd>${link(t.previous_run_id)} (generation ${t.generation})</dd>` : ""}
        ${t.continued_as ? html`<dt>continued as</dt><dd>${link(t.continued_as)}</dd>` : ""}
        ${t.schedule ? html`<dt>schedule</dt><dd>${t.schedule}</dd>` : ""}
        ${t.forked_from ? html`<dt>forked from</dt><dd>${link(t.forked_from.run_id)} at position ${t.forked_from.position}</dd>` : ""}
        <dt>priority</dt><dd data-test="priority">${t.priority} (${PRIORITY[t.priority] || "?"})${t.fairness ? html` · fairness key <span class="mono">${t.fairness.key || "(none)"}</span>${(t.fairness.weight || 1) !== 1 ? `, weight ${t.fairness.weight}` : ""}` : ""}</dd>
        ${Object.keys(t.attributes || {}).length ? html`<dt>attributes</dt><dd data-test="attributes">${Object.entries(t.attributes).map(([k, v]) => html`<span class="tag mono">${k}=${String(v)}</span> `)}</dd>` : ""}
        ${t.children.length ? html`<dt>children</dt><dd>${t.children.map((c) => html`${link(c)} `)}</dd>` : ""}
        <dt>calls</dt><dd>${t.model_calls} model, ${t.tool_calls} other · ${t.events} events in ${t.decisions} decisions</dd>
      </dl></div>
      <h2>Timeline</h2><div class="card"><${Timeline} t=${t} /></div>
      <h2>Output</h2><div class="card"><${Output} runId=${t.run_id} /></div>
    </div><div>
      <h2>Actions</h2><div class="card" data-test="actions"><${Actions} t=${t} onDone=${load} /></div>
      <h2>Spend</h2><div class="card"><${Spend} t=${t} /></div>
      <p><a href=${`/v1/runs/${enc(t.run_id)}/history`} target="_blank" rel="noopener">the history (JSON)</a></p>
    </div></div>`;
}

// --- schedules, workers, dead letters --------------------------------------------------------

function usePolled(path, every) {
  const [data, setData] = useState(null);
  const [error, setError] = useState("");
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    const load = () => api("GET", path).then((d) => live && (setData(d), setError(""))).catch((e) => live && setError(e.message));
    load();
    const timer = setInterval(load, every);
    return () => { live = false; clearInterval(timer); };
  }, [path, tick]);
  return [data, error, () => setTick((n) => n + 1)];
}

function Schedules() {
  const [data, error, reload] = usePolled("/ui/api/schedules", 5000);
  const { ask, dialog, banner } = useAction();
  const flip = (s) => { const verb = s.paused ? "resume" : "pause";
    ask(verb === "pause" ? "Pause" : "Resume", `${verb} schedule ${s.name}?`, async () => { await api("POST", `/v1/schedules/${enc(s.name)}/${verb}`, {}); reload(); return `Schedule ${s.name}: ${verb}d.`; }); };
  return html`<h1>Schedules</h1>${dialog}${banner}${error && html`<p class="error">${error}</p>`}
    <table data-test="schedules"><thead><tr><th>name</th><th>agent</th><th>when</th><th>next fire</th><th>last fire</th><th>last run</th><th>state</th><th></th></tr></thead>
    <tbody>${((data && data.schedules) || []).map((s) => html`<tr key=${s.name}>
      <td class="mono">${s.name}</td><td>${s.spec.agent}</td><td class="mono">${s.spec.cron || (s.spec.every ? `every ${dur(s.spec.every)}` : "")}</td>
      <td title=${clock(s.next_fire_at)}>${s.paused ? "paused" : until(s.next_fire_at)}</td><td>${ago(s.last_fire_at)}</td>
      <td>${s.last_run_id ? html`<a class="mono" href=${`#/run/${enc(s.last_run_id)}`}>${s.last_run_id}</a>` : ""}</td>
      <td>${s.paused ? html`<span class="badge s-suspended">paused</span>` : html`<span class="badge s-running">active</span>`}</td>
      <td>${may("operate") && html`<button onClick=${() => flip(s)}>${s.paused ? "Resume" : "Pause"}</button>`}</td></tr>`)}</tbody></table>
    ${data && !data.schedules.length && html`<p class="muted">No schedules.</p>`}`;
}

function Workers() {
  const [data, error] = usePolled("/ui/api/workers", 2000);
  const t = data ? data.now : now();
  return html`<h1>Workers and liveness</h1>${error && html`<p class="error">${error}</p>`}
    <table data-test="workers"><thead><tr><th>worker</th><th>host / pid</th><th>agents</th><th>runs</th><th>last beat</th><th>state</th></tr></thead>
    <tbody>${((data && data.workers) || []).map((w) => { const late = t - w.at > 3 * (w.interval || 0.25);
      return html`<tr key=${w.worker_id}><td class="mono">${w.worker_id}</td><td>${w.host} / ${w.pid}</td><td>${w.agents.join(", ")}</td>
      <td>${w.active} of ${w.capacity}</td><td>${dur(Math.max(t - w.at, 0))} ago</td>
      <td>${w.stopped ? html`<span class="badge">stopped</span>` : late ? html`<span class="badge s-stalled">silent</span>` : html`<span class="badge s-completed">beating</span>`}</td></tr>`; })}</tbody></table>
    <h2>Runs in trouble</h2>
    <table><thead><tr><th>run</th><th>agent</th><th>liveness</th><th>status</th><th>waiting on / step</th><th>updated</th></tr></thead>
    <tbody>${((data && data.troubled) || []).map((v) => html`<tr key=${v.run_id}><td><a class="mono" href=${`#/run/${enc(v.run_id)}`}>${v.run_id}</a></td>
      <td>${v.agent}</td><td><${Badge} s=${v.liveness} /></td><td><${Badge} s=${v.status} /></td>
      <td class="mono">${v.waiting_on.join(", ") || v.step || ""}</td><td>${ago(v.updated_at)}</td></tr>`)}</tbody></table>
    ${data && !data.troubled.length && html`<p class="muted">No stalled, orphaned, overdue or wedged runs.</p>`}`;
}

function DeadLetters() {
  const [data, error] = usePolled("/ui/api/dead-letters", 5000);
  return html`<h1>Dead letters</h1><p class="muted">What was refused and why, newest first (the bodies stay in the stream).</p>
    ${error && html`<p class="error">${error}</p>`}
    <table data-test="dead-letters"><thead><tr><th>when</th><th>kind</th><th>code</th><th>subject</th><th>why</th><th>size</th></tr></thead>
    <tbody>${((data && data.dead_letters) || []).map((d) => html`<tr key=${d.seq}><td title=${clock(d.rejected_at)}>${ago(d.rejected_at)}</td>
      <td>${d.kind}</td><td class="mono">${d.code}</td><td class="mono">${d.subject}</td><td>${d.message}</td><td>${d.size} B</td></tr>`)}</tbody></table>
    ${data && !data.dead_letters.length && html`<p class="muted">No dead letters.</p>`}`;
}

// --- the frame ---------------------------------------------------------------------------------

const PRIORITY = { 1: "most urgent", 2: "urgent", 3: "default", 4: "low", 5: "bulk" };
const PAGES = [["runs", "Runs"], ["approvals", "Approvals"], ["schedules", "Schedules"], ["workers", "Workers"], ["dead-letters", "Dead letters"]];

function App() {
  const [, setN] = useState(0);
  const [checked, setChecked] = useState(false);
  rerender = () => setN((n) => n + 1);
  useEffect(() => {
    const on = () => rerender();
    addEventListener("hashchange", on);
    api("GET", "/ui/session").then((s) => { session = s; }).catch(() => { session = null; }).finally(() => setChecked(true));
    return () => removeEventListener("hashchange", on);
  }, []);
  if (!checked) return html`<p class="loading">Loading…</p>`;
  if (!session) return html`<${SignIn} onSignedIn=${rerender} />`;
  const { parts, query } = route();
  const page = parts[0] || "runs";
  const signOut = async () => { try { await api("POST", "/ui/session/end"); } finally { session = null; rerender(); } };
  let body;
  if (page === "run" && parts[1]) body = html`<${Run} runId=${parts[1]} key=${parts[1]} />`;
  else if (page === "approvals") body = html`<${Approvals} />`;
  else if (page === "schedules") body = html`<${Schedules} />`;
  else if (page === "workers") body = html`<${Workers} />`;
  else if (page === "dead-letters") body = html`<${DeadLetters} />`;
  else body = html`<${Runs} query=${query} />`;
  return html`<header class="top"><span class="brand">sojourn</span>
      ${PAGES.map(([p, label]) => html`<a href=${`#/${p}`} class=${p === page ? "here" : ""} data-nav=${p}>${label}</a>`)}
      <span class="who" data-test="who">${session.name || "(no name)"} · ${session.role}</span>
      <button onClick=${signOut}>Sign out</button></header>
    <main>${body}</main>`;
}

render(html`<${App} />`, document.getElementById("app"));
