// The web chat of `hermes serve`: plain JavaScript, no build step, nothing fetched from
// elsewhere. It uses the same HTTP API as any client (see /openapi.json).
//
// What a turn shows comes from one place: the session's event stream
// (GET /v1/sessions/{id}/events), each event routed to the view of its own `turn`. A message's
// own stream (POST .../messages) is read only for its `result` (or `error`), so no text is
// ever shown twice. The stream resumes from the last offset seen (Last-Event-ID) after a
// dropped connection, and after a reload from where the running turn began (kept in
// localStorage), so a reload shows the running reply and its pending approvals again.
// Replies are Markdown, rendered by the vendored `marked` and sanitised by `DOMPurify`.
"use strict";

const T = {
  en: {
    signin_title: "Sign in", key_label: "API key", signin: "Sign in", signout: "Sign out",
    new_session: "New session", send: "Send", placeholder: "Type a message…", ui_link: "Temporal Web UI",
    bad_key: "That key was not accepted.", signed_in: "signed in as {0}", tool_head: "tool {0} ",
    tool_ok: "done", tool_failed: "failed (code {0}){1}", approval_needed: "Approval needed: {0}", approve: "Approve",
    reject: "Reject", decided: "{0} by {1}", approved: "approved", rejected: "rejected", memories: "Memories used",
    restarted: "(the answer was cut off; it starts again)", error: "Error: {0}", waiting: "waiting…",
    no_sessions: "No sessions yet.", new_session_title: "New session", turn_status: "turn ended: {0}",
    queued: "queued", step_thinking: "Thinking…", step_writing: "Writing the reply…", step_tool: "Calling tool {0}…",
    step_approval: "Waiting for approval of {0}…", reconnecting: "Connection lost; reconnecting…",
    outcome: "outcome: {0}", status_completed: "completed", status_failed: "failed", status_cancelled: "cancelled",
    status_closed: "closed", status_timed_out: "timed out", status_budget_exceeded: "over budget",
  },
  zh: {
    signin_title: "登录", key_label: "API 密钥", signin: "登录", signout: "退出",
    new_session: "新会话", send: "发送", placeholder: "输入消息…", ui_link: "Temporal 控制台",
    bad_key: "密钥无效。", signed_in: "当前用户：{0}", tool_head: "工具 {0} ",
    tool_ok: "完成", tool_failed: "失败（代码 {0}）{1}", approval_needed: "需要审批：{0}", approve: "批准",
    reject: "拒绝", decided: "{1} 已{0}", approved: "批准", rejected: "拒绝", memories: "用到的记忆",
    restarted: "（回答被中断，重新开始）", error: "错误：{0}", waiting: "等待中…",
    no_sessions: "还没有会话。", new_session_title: "新会话", turn_status: "本轮结束：{0}",
    queued: "排队中", step_thinking: "思考中…", step_writing: "正在回复…", step_tool: "正在调用工具 {0}…",
    step_approval: "等待审批：{0}…", reconnecting: "连接中断，正在重连…",
    outcome: "结果：{0}", status_completed: "完成", status_failed: "失败", status_cancelled: "已取消",
    status_closed: "已关闭", status_timed_out: "超时", status_budget_exceeded: "超出预算",
  },
};
let lang = localStorage.getItem("hermes.lang") || (navigator.language.startsWith("zh") ? "zh" : "en");
const t = (k, ...a) => (T[lang][k] || k).replace(/\{(\d)\}/g, (_, i) => a[i] ?? "");
// A turn's status as an argument of `tx`: translated where known.
const statusText = (s) => (T.en[`status_${s}`] ? { t: `status_${s}` } : s);
const tr = (key, args) => t(key, ...args.map((a) => (a && a.t ? t(a.t) : a)));

// `node` showing the text of `key` with `args` (an argument {t: key} is translated too), again
// in the new language whenever it changes.
function tx(node, key, ...args) {
  node.dataset.i18n = key;
  if (args.length) node.dataset.i18nArgs = JSON.stringify(args);
  node.textContent = tr(key, args);
  return node;
}
const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;

function applyLanguage() {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  document.querySelectorAll("[data-i18n]").forEach((node) => { node.textContent = tr(node.dataset.i18n, JSON.parse(node.dataset.i18nArgs || "[]")); });
  document.querySelectorAll("[data-i18n-placeholder]").forEach((node) => { node.placeholder = t(node.dataset.i18nPlaceholder); });
  $("lang").textContent = lang === "zh" ? "English" : "中文";
  if (info) $("who").textContent = t("signed_in", info.user_id);
  views.forEach(showStep);
}

let key = sessionStorage.getItem("hermes.key");
let info = null;
let current = null;

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(method, path, body, headers = {}, signal = undefined) {
  const res = await fetch(path, {
    method, signal,
    headers: { Authorization: `Bearer ${key}`, ...(body ? { "Content-Type": "application/json" } : {}), ...headers },
    body: body ? JSON.stringify(body) : undefined,
  });
  if (!res.ok) {
    let detail = res.statusText;
    try { detail = (await res.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new ApiError(res.status, detail);
  }
  return res;
}

// Server-sent events of a fetch response: onEvent(type, data, id) per event, until the end.
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let type = "message";
      let data = "";
      let id = null;
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) type = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
        else if (line.startsWith("id: ")) id = line.slice(4);
      }
      if (data) onEvent(type, JSON.parse(data), id);
    }
  }
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function scrollDown() { const m = $("messages"); m.scrollTop = m.scrollHeight; }
function add(node, into) { (into || $("messages")).appendChild(node); scrollDown(); return node; }
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

// ---------------------------------------------------------------- Markdown

if (window.DOMPurify) {
  // Links open elsewhere and tell the other site nothing (no opener, no referrer).
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
}

function renderMarkdown(node, text) {
  node.dataset.text = text;
  if (!window.marked || !window.DOMPurify) { node.textContent = text; return; }
  node.innerHTML = DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: true, async: false }));
}

// ---------------------------------------------------------------- sign in, sessions

async function signIn(candidate) {
  key = candidate;
  try {
    info = await (await api("GET", "/v1/info")).json();
  } catch (err) {
    key = null;
    sessionStorage.removeItem("hermes.key");
    if (err.status === 401) tx($("signin-error"), "bad_key");
    else tx($("signin-error"), "error", err.message);
    return;
  }
  sessionStorage.setItem("hermes.key", key);
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  applyLanguage();
  // A reload reopens the session it had open: from the address (#session=...), else the last one.
  const wanted = new URLSearchParams(location.hash.slice(1)).get("session") || localStorage.getItem("hermes.session");
  if (wanted) {
    try { await openSession(wanted); } catch (err) { current = null; localStorage.removeItem("hermes.session"); }
  }
  await loadSessions();
}

async function loadSessions() {
  const { sessions } = await (await api("GET", "/v1/sessions?limit=100")).json();
  // The open session is listed even before the session index has it.
  if (current && !sessions.some((s) => s.session_id === current)) sessions.unshift({ session_id: current, title: "" });
  const list = $("sessions");
  list.replaceChildren();
  if (!sessions.length) list.appendChild(tx(el("li", "empty"), "no_sessions"));
  for (const s of sessions) {
    const li = el("li", s.session_id === current ? "current" : "", s.title || s.session_id);
    if (!s.title && s.session_id === current) tx(li, "new_session_title");
    li.title = s.session_id;
    li.dataset.sessionId = s.session_id;
    li.onclick = () => openSession(s.session_id).catch((err) => add(tx(el("div", "card warning"), "error", err.message)));
    list.appendChild(li);
  }
}

async function newSession() {
  const created = await (await api("POST", "/v1/sessions", { channel: "web" })).json();
  await openSession(created.session_id);
  await loadSessions();
}

async function openSession(id) {
  stopFollowing();
  current = id;
  views.clear();
  userNodes.clear();
  queue.length = 0;
  cards.clear();
  $("messages").replaceChildren();
  $("session-title").textContent = id;
  history.replaceState(null, "", `#session=${enc(id)}`);
  localStorage.setItem("hermes.session", id);
  document.querySelectorAll("#sessions li").forEach((li) => li.classList.toggle("current", li.dataset.sessionId === id));
  if (info.temporal_ui_url) {
    $("ui-link").href = `${info.temporal_ui_url}/namespaces/${enc(info.namespace)}/workflows/${enc(id)}`;
    $("ui-link").hidden = false;
  }
  const state = await (await api("GET", `/v1/sessions/${enc(id)}`)).json();
  let messages = [];
  try {
    messages = (await (await api("GET", `/v1/sessions/${enc(id)}/transcript`)).json()).messages;
  } catch (err) {
    if (err.status !== 404) add(tx(el("div", "card warning"), "error", err.message));
  }
  if (current !== id) return;
  // The running turn (if any) is shown from its events; the turns before it from the transcript.
  const running = state.busy ? state.turn_count : null;
  shownUpTo = running === null ? state.turn_count : running - 1;
  for (const m of messages) {
    if (m.role === "user") userNodes.set(m.turn, add(el("div", "msg user", m.content)));
    if (m.turn > shownUpTo) continue;
    if (m.role === "assistant") {
      for (const c of m.tool_calls || []) toolStarted(null, { tool_call_id: c.tool_call_id, name: c.name, arguments: JSON.stringify(c.arguments) });
      if (m.content) renderMarkdown(add(el("div", "msg assistant")), m.content);
    } else if (m.role === "tool") {
      let result = {};
      try { result = JSON.parse(m.content); } catch (_) { /* plain text */ }
      toolFinished(null, { tool_call_id: m.tool_call_id, name: m.name, code: result.code ?? 0, message: result.message || "" });
    }
  }
  let after = null; // only new events
  if (running !== null) {
    const view = turnView(running);
    const { approvals } = await (await api("GET", "/v1/approvals")).json();
    for (const a of approvals.filter((p) => p.session_id === id && p.turn >= running)) {
      const waiting = turnView(a.turn);
      approvalRequested(waiting, { tool_call_id: a.tool_call_id, name: a.tool_name, arguments: JSON.stringify(a.arguments) });
      waiting.step = { state: "approval", name: a.tool_name };
    }
    showStep(view);
    after = localStorage.getItem(`hermes.resume.${id}`) || "0-0";
  }
  // Messages this page sent that no turn had taken before the reload: each still waits
  // unless a turn after the last one it was sent behind holds it (the transcript says).
  const taken = new Set();
  for (const entry of storedQueue(id)) {
    const m = messages.find((x, i) => x.role === "user" && !taken.has(i) && x.turn > entry.after && x.content === entry.text);
    if (m) { taken.add(messages.indexOf(m)); continue; }
    const user = add(el("div", "msg user queued", entry.text));
    user.dataset.text = entry.text;
    user.dataset.after = entry.after;
    user.appendChild(tx(el("span", "badge"), "queued"));
    queue.push(user);
  }
  saveQueue();
  follow(id, after);
}

function storedQueue(id) {
  try {
    const kept = JSON.parse(localStorage.getItem(`hermes.queued.${id}`) || "[]");
    return kept.filter((e) => e && typeof e.text === "string").map((e) => ({ text: e.text, after: Number(e.after) || 0 }));
  } catch (_) { return []; }
}

// Kept across a reload: the messages in `queue` (sent from this page, no turn has taken
// them yet), each with the newest turn this page knew when it was sent.
function saveQueue() {
  if (!current) return;
  const kept = queue.map((n) => ({ text: n.dataset.text, after: Number(n.dataset.after) || 0 }));
  if (kept.length) localStorage.setItem(`hermes.queued.${current}`, JSON.stringify(kept));
  else localStorage.removeItem(`hermes.queued.${current}`);
}

function newestTurn() { return Math.max(shownUpTo, 0, ...views.keys()); }

// ---------------------------------------------------------------- the session's event stream

let live = null; // {sessionId, controller, lastOffset, connected: Promise}
let shownUpTo = 0; // turns shown from the transcript: their events are skipped

function stopFollowing() {
  if (live) live.controller.abort();
  live = null;
  setConnected(false);
}

// Follow the session's events from `after` (null: only new ones), reconnecting from the last
// offset seen whenever the connection drops, until another session is opened.
function follow(sessionId, after) {
  const me = { sessionId, controller: new AbortController(), lastOffset: after };
  me.connected = new Promise((resolve) => { me.onConnected = resolve; });
  live = me;
  (async () => {
    let delay = 250;
    while (live === me) {
      try {
        const headers = { Accept: "text/event-stream" };
        if (me.lastOffset) headers["Last-Event-ID"] = me.lastOffset;
        const res = await api("GET", `/v1/sessions/${enc(sessionId)}/events`, null, headers, me.controller.signal);
        delay = 250;
        setConnected(true);
        me.onConnected();
        await readEvents(res, (type, data, id) => { if (live === me) onEvent(me, data, id); });
      } catch (err) {
        if (live !== me) return;
        // An offset the server no longer has (its stream expired): start from what it keeps.
        if (err.status === 400 && me.lastOffset) me.lastOffset = "0-0";
      }
      if (live !== me) return;
      setConnected(false);
      me.controller = new AbortController();
      await Promise.race([sleep(delay), online()]);
      delay = Math.min(delay * 2, 5000);
    }
  })();
}

let onlineWaiters = [];
const online = () => new Promise((resolve) => { onlineWaiters.push(resolve); });
window.addEventListener("online", () => { onlineWaiters.forEach((r) => r()); onlineWaiters = []; });
window.addEventListener("offline", () => { if (live) live.controller.abort(); setConnected(false); });

let connected = false;
let handing = false; // a message is being handed over: Send (and Enter) wait
function setConnected(value) {
  connected = value;
  $("offline").hidden = value || !current;
  updateSend();
}
function updateSend() { $("send").disabled = handing || (current !== null && !connected); }

function isAfter(a, b) {
  const [am, as] = a.split("-").map(Number);
  const [bm, bs] = b.split("-").map(Number);
  return am > bm || (am === bm && as > bs);
}

// The offset just before `offset` (stream offsets are "<ms>-<seq>", increasing).
function justBefore(offset) {
  const [ms, seq] = offset.split("-").map(Number);
  if (seq > 0) return `${ms}-${seq - 1}`;
  return ms > 0 ? `${ms - 1}-999999999` : "0-0";
}

function onEvent(me, ev, id) {
  const offset = id || ev.offset;
  if (offset && ev.type !== "truncated") {
    if (me.lastOffset && me.lastOffset !== "0-0" && !isAfter(offset, me.lastOffset)) return; // seen already
    me.lastOffset = offset;
  }
  if (ev.turn === null || ev.turn === undefined) {
    if (ev.type === "warning") add(el("div", "card warning", ev.data.text));
    return;
  }
  if (ev.turn <= shownUpTo) return;
  const view = turnView(ev.turn, me);
  if (view.done && ev.type !== "approval_decided" && ev.type !== "tool_call_finished") return;
  const d = ev.data || {};
  switch (ev.type) {
    case "turn_started": view.step = { state: "thinking" }; break;
    case "text_delta": {
      const b = bubble(view, ev.step);
      if (b.attempt && ev.attempt && b.attempt !== ev.attempt) b.text = ""; // a newer attempt of the step
      b.attempt = ev.attempt || b.attempt;
      b.text += d.text;
      renderMarkdown(b.node, b.text);
      view.step = { state: "writing" };
      scrollDown();
      break;
    }
    case "attempt_discarded": {
      const b = view.bubbles.get(ev.step);
      if (b && b.text) { b.text = ""; renderMarkdown(b.node, ""); add(tx(el("div", "card warning"), "restarted"), view.body); }
      break;
    }
    case "tool_call_started": toolStarted(view, d); view.step = { state: "tool", name: d.name }; break;
    case "tool_call_finished": toolFinished(view, d); if (!d.retrying) view.step = { state: "thinking" }; break;
    case "approval_requested": approvalRequested(view, d); view.step = { state: "approval", name: d.name }; break;
    case "approval_decided": approvalDecided(d); view.step = d.approved ? { state: "tool", name: d.name } : { state: "thinking" }; break;
    case "memories_recalled":
      if (d.memories && d.memories.length) {
        const card = add(el("div", "card memories"), view.body);
        card.append(tx(el("strong"), "memories"));
        const ul = el("ul");
        for (const m of d.memories) ul.appendChild(el("li", "", m.text));
        card.appendChild(ul);
      }
      break;
    case "warning": view.warned = true; add(el("div", "card warning", d.text), view.body); break;
    case "turn_finished":
      if (d.status && d.status !== "completed") add(tx(el("div", "card warning"), "turn_status", statusText(d.status)), view.body);
      finish(view);
      break;
    default: break;
  }
  showStep(view);
}

// ---------------------------------------------------------------- one view per turn

const views = new Map(); // turn -> {turn, node, body, stepNode, bubbles: Map(step -> {node, text, attempt}), step, done}
const userNodes = new Map(); // turn -> the user's message
const queue = []; // messages sent from here that no turn has taken yet, oldest first

function turnView(turn, me) {
  let view = views.get(turn);
  if (view) return view;
  // Where a reload resumes: just before the first event of the oldest turn still running.
  if (me && current && me.lastOffset && ![...views.values()].some((v) => !v.done)) {
    localStorage.setItem(`hermes.resume.${current}`, justBefore(me.lastOffset));
  }
  view = { turn, node: el("div", "turn"), body: el("div", "body"), stepNode: el("div", "step"), bubbles: new Map(), step: { state: "thinking" }, done: false };
  view.node.dataset.turn = turn;
  view.node.append(view.body, view.stepNode);
  let user = userNodes.get(turn);
  if (!user && queue.length) {
    user = queue.shift(); // messages are taken in the order they were sent
    user.classList.remove("queued", "pending");
    user.querySelector(".badge")?.remove();
    userNodes.set(turn, user);
    saveQueue();
  }
  if (user) user.after(view.node);
  else {
    add(view.node);
    fillUserMessage(view);
  }
  views.set(turn, view);
  // A session runs one turn at a time: one that started ends those before it, even where
  // their turn_finished event was lost (no cursor or step line is left on them).
  views.forEach((v) => { if (v.turn < turn && !v.done) finish(v); });
  scrollDown();
  return view;
}

// A turn started elsewhere (another tab, a message queued before a reload): show its message.
async function fillUserMessage(view) {
  const id = current;
  try {
    const { messages } = await (await api("GET", `/v1/sessions/${enc(id)}/transcript`)).json();
    const m = messages.find((x) => x.role === "user" && x.turn === view.turn);
    if (m && id === current && !userNodes.has(view.turn)) {
      const node = el("div", "msg user", m.content);
      view.node.before(node);
      userNodes.set(view.turn, node);
    }
  } catch (_) { /* the view stands without it */ }
}

function bubble(view, step) {
  let b = view.bubbles.get(step);
  if (!b) {
    b = { node: add(el("div", "msg assistant streaming"), view.body), text: "", attempt: null };
    b.node.dataset.step = step;
    view.bubbles.set(step, b);
  }
  return b;
}

function showStep(view) {
  const node = view.stepNode;
  if (view.done) { node.hidden = true; return; }
  const { state, name } = view.step;
  node.hidden = false;
  node.dataset.state = state;
  node.textContent = t(`step_${state}`, name || "");
}

function finish(view, result) {
  if (result && result.reply) {
    // The result is the record: it fills in text the events did not bring.
    const last = [...view.bubbles.values()].pop();
    if (!last) renderMarkdown(add(el("div", "msg assistant"), view.body), result.reply);
    else if (last.text.trim() !== result.reply.trim()) { last.text = result.reply; renderMarkdown(last.node, result.reply); }
  }
  if (result && !view.done) {
    if (result.status !== "completed") add(tx(el("div", "card warning"), "turn_status", statusText(result.status)), view.body);
    if (!view.warned) for (const w of result.warnings || []) add(el("div", "card warning", w), view.body);
  }
  view.done = true;
  view.bubbles.forEach((b) => b.node.classList.remove("streaming"));
  showStep(view);
  if (![...views.values()].some((v) => !v.done) && current) loadSessions().catch(() => {});
}

// ---------------------------------------------------------------- tool calls and approvals

const cards = new Map(); // tool_call_id -> {tool, approval}

function toolStarted(view, d) {
  const entry = cards.get(d.tool_call_id) || {};
  if (!entry.tool) {
    entry.tool = el("div", "card tool");
    entry.tool.dataset.toolCallId = d.tool_call_id;
    entry.tool.append(tx(el("strong"), "tool_head", d.name), el("code", "", d.arguments || "{}"), tx(el("div", "outcome"), "waiting"));
    if (entry.approval) entry.approval.before(entry.tool);
    else add(entry.tool, view && view.body);
    cards.set(d.tool_call_id, entry);
  }
}

function toolFinished(view, d) {
  if (d.retrying) return;
  toolStarted(view, d);
  const outcome = cards.get(d.tool_call_id).tool.querySelector(".outcome");
  outcome.className = `outcome ${d.code === 0 ? "code0" : "codeN"}`;
  // The tool's own message is its data (in its language): shown when it failed, a hover otherwise.
  if (d.code === 0) tx(outcome, "tool_ok");
  else tx(outcome, "tool_failed", d.code, d.message ? ` · ${d.message}` : "");
  if (d.message) outcome.title = d.message;
}

function approvalRequested(view, d) {
  const entry = cards.get(d.tool_call_id) || {};
  if (entry.approval) return;
  const card = add(el("div", "card approval"), view && view.body);
  card.dataset.toolCallId = d.tool_call_id;
  card.append(tx(el("strong"), "approval_needed", d.name), el("div", "", ""), el("code", "", d.arguments || ""));
  const row = el("div", "buttons");
  for (const [word, approve] of [["approve", true], ["reject", false]]) {
    const b = tx(el("button", word), word);
    b.type = "button";
    b.dataset.testid = word;
    b.onclick = () => decide(current, d.tool_call_id, approve, card);
    row.appendChild(b);
  }
  card.appendChild(row);
  entry.approval = card;
  cards.set(d.tool_call_id, entry);
}

async function decide(sessionId, toolCallId, approve, card) {
  card.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  try {
    const path = `/v1/sessions/${enc(sessionId)}/approvals/${enc(toolCallId)}/${approve ? "approve" : "reject"}`;
    const record = await (await api("POST", path)).json();
    // The stream's approval_decided event may have answered the card already.
    const decided = card.querySelector(".decided") || el("div", "decided");
    tx(decided, "decided", { t: approve ? "approved" : "rejected" }, info.user_id);
    decided.title = t("outcome", record.outcome);
    const buttons = card.querySelector(".buttons");
    if (buttons) buttons.replaceWith(decided);
  } catch (err) {
    card.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    card.appendChild(tx(el("div", "error"), "error", err.message));
  }
}

function approvalDecided(d) {
  const card = (cards.get(d.tool_call_id) || {}).approval;
  if (card && card.querySelector(".buttons")) {
    card.querySelector(".buttons").replaceWith(tx(el("div", "decided"), "decided", { t: d.approved ? "approved" : "rejected" }, d.approver || ""));
  }
}

// ---------------------------------------------------------------- sending

// Each message typed is its own message, even with the text of one just sent: without a
// key, the server takes the same body within its retry window as a retry of the first.
function messageKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16)); // (randomUUID needs a secure context)
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Hand `text` to the session; read its stream for the result only (the events come from the
// session's stream). A network failure before the server took it is retried with the same
// Idempotency-Key (the server answers a retry from the first); after, the events finish the turn.
async function send(sessionId, text, user, accepted) {
  const messageId = messageKey();
  for (let tries = 0; ; tries++) {
    let taken = false;
    try {
      const res = await api("POST", `/v1/sessions/${enc(sessionId)}/messages`, { text },
        { Accept: "text/event-stream", "Idempotency-Key": messageId });
      taken = true;
      accepted();
      await readEvents(res, (type, data) => {
        if (sessionId !== current) return;
        if (type === "result") {
          if (!userNodes.has(data.turn) && queue.includes(user)) { queue.splice(queue.indexOf(user), 1); userNodes.set(data.turn, user); saveQueue(); }
          finish(turnView(data.turn), data);
        } else if (type === "error") {
          queue.includes(user) && queue.splice(queue.indexOf(user), 1) && saveQueue();
          user.after(tx(el("div", "card warning"), "error", data.detail));
        }
      });
      return;
    } catch (err) {
      if (err instanceof ApiError || taken || tries >= 5) throw err;
      await Promise.race([sleep(500 * 2 ** tries), online()]);
    }
  }
}

async function submit() {
  if ($("send").disabled) return; // Enter does what the button does, nothing while it is disabled
  const text = $("text").value.trim();
  if (!text) return;
  handing = true;
  updateSend();
  try {
    if (!current) await newSession();
    await live.connected;
    $("text").value = "";
    const sessionId = current;
    // Queued when a turn runs, or another message waits: it is answered after them.
    const busy = queue.length > 0 || [...views.values()].some((v) => !v.done);
    const user = add(el("div", `msg user ${busy ? "queued" : "pending"}`, text));
    user.dataset.text = text;
    user.dataset.after = newestTurn();
    if (busy) user.appendChild(tx(el("span", "badge"), "queued"));
    queue.push(user);
    saveQueue();
    let taken = false;
    await send(sessionId, text, user, () => { taken = true; handing = false; updateSend(); }).catch((err) => {
      // Taken and then cut off: the turn goes on, and the session's stream shows it.
      if (taken && !(err instanceof ApiError)) return;
      user.after(tx(el("div", "card warning"), "error", err.message));
      if (queue.includes(user)) queue.splice(queue.indexOf(user), 1);
      saveQueue();
    });
  } catch (err) {
    add(tx(el("div", "card warning"), "error", err.message));
  } finally {
    handing = false;
    updateSend();
  }
}

// ---------------------------------------------------------------- wiring

$("lang").onclick = () => { lang = lang === "zh" ? "en" : "zh"; localStorage.setItem("hermes.lang", lang); applyLanguage(); };
$("signin-form").onsubmit = (e) => { e.preventDefault(); signIn($("key").value.trim()); };
$("signout").onclick = () => { sessionStorage.removeItem("hermes.key"); location.reload(); };
$("new-session").onclick = () => newSession().catch((err) => add(tx(el("div", "card warning"), "error", err.message)));
$("composer").onsubmit = (e) => { e.preventDefault(); submit(); };
$("text").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
});
applyLanguage();
updateSend();
if (key) signIn(key);
