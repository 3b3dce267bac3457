// The web chat of `hermes serve`: plain JavaScript, no build step, nothing fetched from
// elsewhere. It uses the same HTTP API as any client (see /openapi.json).
"use strict";

const T = {
  en: {
    signin_title: "Sign in", key_label: "API key", signin: "Sign in", signout: "Sign out",
    new_session: "New session", send: "Send", placeholder: "Type a message…", ui_link: "Temporal Web UI",
    bad_key: "That key was not accepted.", signed_in: "signed in as {0}", tool: "tool", result: "result",
    code: "code {0}", approval_needed: "Approval needed: {0}", approve: "Approve", reject: "Reject",
    decided: "{0} by {1}", approved: "approved", rejected: "rejected", memories: "Memories used",
    restarted: "(the answer was cut off; it starts again)", error: "Error: {0}", waiting: "waiting…",
    no_sessions: "No sessions yet.", turn_status: "turn ended: {0}",
  },
  zh: {
    signin_title: "登录", key_label: "API 密钥", signin: "登录", signout: "退出",
    new_session: "新会话", send: "发送", placeholder: "输入消息…", ui_link: "Temporal 控制台",
    bad_key: "密钥无效。", signed_in: "当前用户：{0}", tool: "工具", result: "结果",
    code: "代码 {0}", approval_needed: "需要审批：{0}", approve: "批准", reject: "拒绝",
    decided: "{1} 已{0}", approved: "批准", rejected: "拒绝", memories: "用到的记忆",
    restarted: "（回答被中断，重新开始）", error: "错误：{0}", waiting: "等待中…",
    no_sessions: "还没有会话。", turn_status: "本轮结束：{0}",
  },
};
let lang = localStorage.getItem("hermes.lang") || (navigator.language.startsWith("zh") ? "zh" : "en");
const t = (k, ...a) => (T[lang][k] || k).replace(/\{(\d)\}/g, (_, i) => a[i] ?? "");
const $ = (id) => document.getElementById(id);

function applyLanguage() {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  document.querySelectorAll("[data-i18n]").forEach((el) => { el.textContent = t(el.dataset.i18n); });
  document.querySelectorAll("[data-i18n-placeholder]").forEach((el) => { el.placeholder = t(el.dataset.i18nPlaceholder); });
  $("lang").textContent = lang === "zh" ? "English" : "中文";
  if (info) $("who").textContent = t("signed_in", info.user_id);
}

let key = sessionStorage.getItem("hermes.key");
let info = null;
let current = null;

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(method, path, body, headers = {}) {
  const res = await fetch(path, {
    method,
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

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function scrollDown() { const m = $("messages"); m.scrollTop = m.scrollHeight; }
function add(node) { $("messages").appendChild(node); scrollDown(); return node; }

// ---------------------------------------------------------------- sign in, sessions

async function signIn(candidate) {
  key = candidate;
  try {
    info = await (await api("GET", "/v1/info")).json();
  } catch (err) {
    key = null;
    sessionStorage.removeItem("hermes.key");
    $("signin-error").textContent = err.status === 401 ? t("bad_key") : t("error", err.message);
    return;
  }
  sessionStorage.setItem("hermes.key", key);
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  applyLanguage();
  await loadSessions();
}

async function loadSessions() {
  const { sessions } = await (await api("GET", "/v1/sessions?limit=100")).json();
  const list = $("sessions");
  list.replaceChildren();
  if (!sessions.length) list.appendChild(el("li", "", t("no_sessions")));
  for (const s of sessions) {
    const li = el("li", s.session_id === current ? "current" : "", s.title || s.session_id);
    li.title = s.session_id;
    li.dataset.sessionId = s.session_id;
    li.onclick = () => openSession(s.session_id);
    list.appendChild(li);
  }
}

async function newSession() {
  const created = await (await api("POST", "/v1/sessions", { channel: "web" })).json();
  await openSession(created.session_id);
  await loadSessions();
}

async function openSession(id) {
  current = id;
  turnView = null;
  cards.clear();
  $("messages").replaceChildren();
  $("session-title").textContent = id;
  document.querySelectorAll("#sessions li").forEach((li) => li.classList.toggle("current", li.dataset.sessionId === id));
  if (info.temporal_ui_url) {
    $("ui-link").href = `${info.temporal_ui_url}/namespaces/${encodeURIComponent(info.namespace)}/workflows/${encodeURIComponent(id)}`;
    $("ui-link").hidden = false;
  }
  let messages = [];
  try {
    messages = (await (await api("GET", `/v1/sessions/${encodeURIComponent(id)}/transcript`)).json()).messages;
  } catch (err) {
    if (err.status !== 404) add(el("div", "card warning", t("error", err.message)));
  }
  for (const m of messages) {
    if (m.role === "user") add(el("div", "msg user", m.content));
    else if (m.role === "assistant") {
      for (const c of m.tool_calls || []) toolStarted({ tool_call_id: c.tool_call_id, name: c.name, arguments: JSON.stringify(c.arguments) });
      if (m.content) add(el("div", "msg assistant", m.content));
    } else if (m.role === "tool") {
      let result = {};
      try { result = JSON.parse(m.content); } catch (_) { /* plain text */ }
      toolFinished({ tool_call_id: m.tool_call_id, name: m.name, code: result.code ?? 0, message: result.message || "" });
    }
  }
  const { approvals } = await (await api("GET", "/v1/approvals")).json();
  for (const a of approvals.filter((p) => p.session_id === id)) {
    approvalRequested({ tool_call_id: a.tool_call_id, name: a.tool_name, arguments: JSON.stringify(a.arguments), permission: a.permission });
  }
}

// ---------------------------------------------------------------- a turn's events

const cards = new Map(); // tool_call_id -> {tool, approval}
let turnView = null; // {bubbles: Map(step -> node)}

function bubble(step) {
  let node = turnView.bubbles.get(step);
  if (!node) {
    node = add(el("div", "msg assistant streaming"));
    node.dataset.step = step;
    turnView.bubbles.set(step, node);
  }
  return node;
}

function toolStarted(d) {
  const entry = cards.get(d.tool_call_id) || {};
  if (!entry.tool) {
    entry.tool = add(el("div", "card tool"));
    entry.tool.dataset.toolCallId = d.tool_call_id;
    entry.tool.append(el("strong", "", `${t("tool")} ${d.name} `), el("code", "", d.arguments || "{}"), el("div", "outcome", t("waiting")));
    cards.set(d.tool_call_id, entry);
  }
}

function toolFinished(d) {
  if (d.retrying) return;
  toolStarted(d);
  const outcome = cards.get(d.tool_call_id).tool.querySelector(".outcome");
  outcome.className = `outcome ${d.code === 0 ? "code0" : "codeN"}`;
  outcome.textContent = `${t("code", d.code)}${d.message && d.message !== "ok" ? " · " + d.message : ""}`;
}

function approvalRequested(d) {
  const entry = cards.get(d.tool_call_id) || {};
  if (entry.approval) return;
  const card = add(el("div", "card approval"));
  card.dataset.toolCallId = d.tool_call_id;
  card.append(el("strong", "", t("approval_needed", d.name)), el("div", "", ""), el("code", "", d.arguments || ""));
  const row = el("div", "buttons");
  for (const [word, approve] of [["approve", true], ["reject", false]]) {
    const b = el("button", word, t(word));
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
    const path = `/v1/sessions/${encodeURIComponent(sessionId)}/approvals/${encodeURIComponent(toolCallId)}/${approve ? "approve" : "reject"}`;
    const record = await (await api("POST", path)).json();
    // The stream's approval_decided event may have answered the card already.
    const decided = card.querySelector(".decided") || el("div", "decided");
    decided.textContent = t("decided", t(approve ? "approved" : "rejected"), info.user_id) + ` (${record.outcome})`;
    const buttons = card.querySelector(".buttons");
    if (buttons) buttons.replaceWith(decided);
  } catch (err) {
    card.querySelectorAll("button").forEach((b) => { b.disabled = false; });
    card.appendChild(el("div", "error", t("error", err.message)));
  }
}

function approvalDecided(d) {
  const card = (cards.get(d.tool_call_id) || {}).approval;
  if (card && card.querySelector(".buttons")) {
    card.querySelector(".buttons").replaceWith(el("div", "decided", t("decided", t(d.approved ? "approved" : "rejected"), d.approver || "")));
  }
}

function onEvent(type, data) {
  const d = data.data || {};
  switch (type) {
    case "text_delta": bubble(data.step).textContent += d.text; scrollDown(); break;
    case "attempt_discarded": {
      const node = turnView.bubbles.get(data.step);
      if (node) { node.textContent = ""; add(el("div", "card warning", t("restarted"))); }
      break;
    }
    case "tool_call_started": toolStarted(d); break;
    case "tool_call_finished": toolFinished(d); break;
    case "approval_requested": approvalRequested(d); break;
    case "approval_decided": approvalDecided(d); break;
    case "memories_recalled":
      if (d.memories && d.memories.length) {
        const card = add(el("div", "card memories"));
        card.append(el("strong", "", t("memories")));
        const ul = el("ul");
        for (const m of d.memories) ul.appendChild(el("li", "", m.text));
        card.appendChild(ul);
      }
      break;
    case "warning": add(el("div", "card warning", d.text)); break;
    case "result": {
      turnView.bubbles.forEach((node) => node.classList.remove("streaming"));
      const last = [...turnView.bubbles.values()].pop();
      if (!last || last.textContent.trim() !== data.reply.trim()) add(el("div", "msg assistant", data.reply));
      if (data.status !== "completed") add(el("div", "card warning", t("turn_status", data.status)));
      for (const w of data.warnings || []) add(el("div", "card warning", w));
      break;
    }
    case "error": add(el("div", "card warning", t("error", data.detail))); break;
    default: break;
  }
}

// Each message typed is its own message, even with the text of one just sent: without a
// key, the server takes the same body within its retry window as a retry of the first.
function messageKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16)); // (randomUUID needs a secure context)
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function send(text) {
  const sessionId = current;
  add(el("div", "msg user", text));
  turnView = { bubbles: new Map() };
  const res = await api("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/messages`, { text },
    { Accept: "text/event-stream", "Idempotency-Key": messageKey() });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let type = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) type = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data && sessionId === current) onEvent(type, JSON.parse(data));
    }
  }
}

// ---------------------------------------------------------------- wiring

$("lang").onclick = () => { lang = lang === "zh" ? "en" : "zh"; localStorage.setItem("hermes.lang", lang); applyLanguage(); };
$("signin-form").onsubmit = (e) => { e.preventDefault(); signIn($("key").value.trim()); };
$("signout").onclick = () => { sessionStorage.removeItem("hermes.key"); location.reload(); };
$("new-session").onclick = () => newSession().catch((err) => add(el("div", "card warning", t("error", err.message))));
$("composer").onsubmit = async (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  if (!current) await newSession();
  $("text").value = "";
  $("send").disabled = true;
  try {
    await send(text);
    await loadSessions();
  } catch (err) {
    add(el("div", "card warning", t("error", err.message)));
  } finally {
    $("send").disabled = false;
  }
};
$("text").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
});
applyLanguage();
if (key) signIn(key);
