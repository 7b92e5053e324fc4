// The Locks page. Plain JavaScript, no framework: the server sends the
// whole state as the first event of a stream, then every change; this
// script keeps three tables in step with it and counts expiries down.
// Every URL is relative: the secret is the first segment of the page's
// path, and nothing is ever sent anywhere else.
"use strict";

const state = {
  scope: null,                 // a namespace, or "" for all of them
  permits: new Map(),          // "ns/name" -> row
  waiters: new Map(),          // key -> row
  guarded: new Map(),          // key -> row
  sources: new Map(),          // source name -> status
  access: { namespaces: {}, permits: {} },
  sort: { key: "expires", dir: 1 },
  filter: "",
  connected: false,
};

const $ = (sel) => document.querySelector(sel);
const permitBody = () => $("#permits tbody");
const rowEls = new Map();      // "ns/name" -> <tr>
let dirty = new Set();         // permit keys to redraw
let dirtyAll = false;          // every permit row, the order, the other tables
let flushQueued = false;

// ---- formatting -----------------------------------------------------------

function pad(n) { return String(n).padStart(2, "0"); }

function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const now = new Date();
  const hms = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  if (d.toDateString() === now.toDateString()) return hms;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hms}`;
}

function fmtDuration(ms) {
  let s = Math.max(0, Math.floor(ms / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d > 0) return `${d}d ${h}h`;
  if (h > 0) return `${h}h ${pad(m)}m`;
  if (m > 0) return `${m}m ${pad(s)}s`;
  return `${s}s`;
}

function ago(iso, now) {
  if (!iso) return "";
  return `${fmtDuration(now - Date.parse(iso))} ago`;
}

// expiry answers the text of a permit's expiry and whether it is overdue.
// The times are the API server's; the count uses this machine's clock.
function expiry(p, now) {
  if (!p.expireTime) return { text: "", overdue: false };
  const left = Date.parse(p.expireTime) - now;
  if (left > 0) return { text: `in ${fmtDuration(left)}`, overdue: false };
  return { text: `overdue by ${fmtDuration(-left)}`, overdue: true };
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

// ---- derived views ----------------------------------------------------------

const lockKey = (ns, lock) => `${ns}\u0000${lock}`;

// line answers the waiters of every lock, each in line order, with its place.
function lines() {
  const by = new Map();
  for (const w of state.waiters.values()) {
    const k = lockKey(w.namespace, w.lock);
    if (!by.has(k)) by.set(k, []);
    by.get(k).push(w);
  }
  for (const ws of by.values()) {
    ws.sort((a, b) => (a.since < b.since ? -1 : a.since > b.since ? 1 : a.order < b.order ? -1 : a.order > b.order ? 1 : 0));
  }
  return by;
}

function guardedBy() {
  const by = new Map();
  for (const g of state.guarded.values()) {
    const k = `${lockKey(g.namespace, g.lock)}\u0000${g.slot}`;
    if (!by.has(k)) by.set(k, []);
    by.get(k).push(g);
  }
  for (const gs of by.values()) gs.sort((a, b) => (a.kind + a.name < b.kind + b.name ? -1 : 1));
  return by;
}

function mayRelease(p) {
  return !!(state.access.namespaces[p.namespace] || state.access.permits[`${p.namespace}/${p.name}`]);
}

function matches(lock) {
  return state.filter === "" || lock.toLowerCase().includes(state.filter);
}

// ---- the permits table ------------------------------------------------------

let waitingIndex = new Map();
let guardedIndex = new Map();

function permitRow(p, now) {
  let tr = rowEls.get(`${p.namespace}/${p.name}`);
  if (!tr) {
    tr = el("tr");
    tr.dataset.key = `${p.namespace}/${p.name}`;
    for (const cls of ["col-ns", "lock", "slot num", "owner", "pod", "token", "since", "renew", "expires", "waiting num", "guarded", "action"]) {
      tr.append(el(cls === "lock" ? "th" : "td", cls === "lock" ? { class: cls, scope: "row" } : { class: cls }));
    }
    rowEls.set(tr.dataset.key, tr);
  }
  const c = tr.children;
  if (tr.dataset.token && tr.dataset.token !== p.token) {
    // Restart the flash by switching its name (style.css): reading the
    // row's layout to restart it would lay out the whole table each time.
    if (tr.classList.contains("changed")) tr.classList.toggle("again");
    else tr.classList.add("changed");
  }
  tr.dataset.token = p.token;
  tr.dataset.lock = p.lock;
  c[0].textContent = p.namespace;
  c[1].textContent = p.lock;
  c[2].textContent = `${p.slot} / ${p.limit}`;
  c[3].textContent = p.owner;
  c[4].textContent = p.holderPod || "—";
  c[5].textContent = p.token;
  c[6].replaceChildren(fmtTime(p.acquireTime), el("span", { class: "sub", text: ago(p.acquireTime, now) }));
  c[6].title = p.acquireTime || "";
  c[7].replaceChildren(fmtTime(p.renewTime), el("span", { class: "sub renew-ago", text: ago(p.renewTime, now) }));
  c[7].title = p.renewTime || "";
  drawExpiry(tr, p, now);
  c[8].title = p.expireTime ? `${p.expireTime} (ttl ${p.ttlSeconds}s)` : "";
  const ws = waitingIndex.get(lockKey(p.namespace, p.lock)) || [];
  c[9].textContent = ws.length ? String(ws.length) : "none";
  const gs = guardedIndex.get(`${lockKey(p.namespace, p.lock)}\u0000${p.slot}`) || [];
  c[10].textContent = gs.length === 0 ? "none" :
    gs.slice(0, 3).map((g) => `${g.kind} ${g.name}`).join(", ") + (gs.length > 3 ? `, and ${gs.length - 3} more` : "");
  drawAction(tr, p);
  tr.hidden = !matches(p.lock);
  return tr;
}

function drawExpiry(tr, p, now) {
  const e = expiry(p, now);
  const cell = tr.children[8];
  let text = e.text;
  if (p.releasing) text = `releasing · ${text}`;
  if (cell.dataset.text !== text) {
    cell.dataset.text = text;
    if (e.overdue) {
      cell.replaceChildren(el("span", { class: "marker", text: "overdue" }), " ", text.replace("overdue by ", "by "));
    } else {
      cell.textContent = text;
    }
  }
  tr.classList.toggle("overdue", e.overdue);
  tr.classList.toggle("releasing", !!p.releasing);
  const sub = tr.children[7].querySelector(".renew-ago");
  if (sub) {
    const a = ago(p.renewTime, now);
    if (sub.textContent !== a) sub.textContent = a;
  }
}

function drawAction(tr, p) {
  const cell = tr.children[11];
  const want = mayRelease(p) && !p.releasing;
  const btn = cell.firstElementChild;
  if (want && !btn) {
    const b = el("button", { type: "button", class: "release", text: "Release…" });
    b.setAttribute("aria-label", `Release ${p.lock} slot ${p.slot}`);
    b.addEventListener("click", () => openConfirm(tr.dataset.key, b));
    cell.replaceChildren(b);
  } else if (!want && btn) {
    if (btn === document.activeElement) $("#notice").focus();
    cell.replaceChildren();
  } else if (btn) {
    btn.setAttribute("aria-label", `Release ${p.lock} slot ${p.slot}`);
  }
}

function compare(a, b) {
  const { key, dir } = state.sort;
  let x, y;
  if (key === "since") { x = a.acquireTime || ""; y = b.acquireTime || ""; }
  else if (key === "lock") { x = a.lock; y = b.lock; }
  else { x = a.expireTime || ""; y = b.expireTime || ""; }
  if (x !== y) return (x < y ? -1 : 1) * dir;
  const ka = `${a.namespace}/${a.lock}/${String(a.slot).padStart(5, "0")}`;
  const kb = `${b.namespace}/${b.lock}/${String(b.slot).padStart(5, "0")}`;
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

// stay answers which of rows, in the order the table shows them now, can
// stay where they are: the longest run of them already in the wanted
// order (the longest increasing subsequence of their wanted places).
function stay(rows, want) {
  const tails = [], tailAt = [], prev = new Array(rows.length);
  rows.forEach((r, i) => {
    const w = want.get(r);
    if (w === undefined) return;
    let lo = 0, hi = tails.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (tails[mid] < w) lo = mid + 1; else hi = mid; }
    tails[lo] = w; tailAt[lo] = i;
    prev[i] = lo > 0 ? tailAt[lo - 1] : -1;
  });
  const keep = new Set();
  for (let i = tails.length ? tailAt[tails.length - 1] : -1; i >= 0; i = prev[i]) keep.add(rows[i]);
  return keep;
}

function order() {
  const body = permitBody();
  const rows = [...state.permits.values()].sort(compare).map((p) => rowEls.get(`${p.namespace}/${p.name}`));
  const shown = [...body.children];
  let same = shown.length === rows.length;
  for (let i = 0; same && i < rows.length; i++) same = shown[i] === rows[i];
  if (same) return;
  // Moving a row takes focus from a button in it: give it back.
  const focused = document.activeElement;
  // A renew moves its row (sorted by expiry, it goes to the end): move
  // only the rows out of place, not the whole table, which the browser
  // would lay out again whole at every renew.
  const want = new Map(rows.map((r, i) => [r, i]));
  const keep = stay(shown, want);
  if (keep.size < rows.length / 2) {
    const frag = document.createDocumentFragment();
    for (const r of rows) frag.append(r);
    body.replaceChildren(frag);
  } else {
    let next = null;
    for (let i = rows.length - 1; i >= 0; i--) {
      if (!keep.has(rows[i])) body.insertBefore(rows[i], next);
      next = rows[i];
    }
  }
  if (focused && focused !== document.activeElement && document.contains(focused)) focused.focus({ preventScroll: true });
}

// ---- the other tables ---------------------------------------------------

function drawWaiters(by) {
  const body = $("#waiters tbody");
  const trs = [];
  const keys = [...by.keys()].sort();
  let n = 0;
  for (const k of keys) {
    by.get(k).forEach((w, i) => {
      n++;
      const tr = el("tr", null,
        el("td", { class: "col-ns", text: w.namespace }),
        el("th", { scope: "row", text: w.lock }),
        el("td", { class: "num", text: `${i + 1} of ${by.get(k).length}` }),
        el("td", { text: `${w.kind} ${w.name}` }),
        el("td", { text: w.owner }),
        el("td", { title: w.since }, fmtTime(w.since), el("span", { class: "sub", text: ago(w.since, Date.now()) })),
        el("td", { text: w.note || "" }));
      tr.dataset.key = w.namespace + "/" + w.name;
      tr.dataset.lock = w.lock;
      tr.hidden = !matches(w.lock);
      trs.push(tr);
    });
  }
  body.replaceChildren(...trs);
  $("#no-waiters").hidden = n > 0;
  $("#waiter-count").textContent = n ? `(${n})` : "";
}

function drawGuarded() {
  const body = $("#guarded tbody");
  const gs = [...state.guarded.values()].sort((a, b) =>
    a.namespace + a.lock + a.slot + a.kind + a.name < b.namespace + b.lock + b.slot + b.kind + b.name ? -1 : 1);
  body.replaceChildren(...gs.map((g) => {
    const tr = el("tr", null,
      el("td", { class: "col-ns", text: g.namespace }),
      el("th", { scope: "row", text: g.lock }),
      el("td", { class: "num", text: String(g.slot) }),
      el("td", { text: `${g.kind} ${g.name}` }),
      el("td", { class: "token", text: g.token }));
    tr.dataset.lock = g.lock;
    tr.hidden = !matches(g.lock);
    return tr;
  }));
  $("#no-guarded").hidden = gs.length > 0;
  $("#guarded-count").textContent = gs.length ? `(${gs.length})` : "";
}

// ---- drawing ------------------------------------------------------------

function schedule() {
  if (flushQueued) return;
  flushQueued = true;
  // Whichever comes first: a frame, or a timer for a page in the background.
  const run = () => { if (flushQueued) { flushQueued = false; flush(); } };
  requestAnimationFrame(run);
  setTimeout(run, 250);
}

let othersDirty = true;

function flush() {
  const now = Date.now();
  if (othersDirty) {
    const by = lines();
    waitingIndex = by;
    guardedIndex = guardedBy();
    drawWaiters(by);
    drawGuarded();
    othersDirty = false;
    dirtyAll = true; // counts of waiters and guarded objects in the rows
  }
  const keys = dirtyAll ? [...state.permits.keys()] : [...dirty];
  for (const k of keys) {
    const p = state.permits.get(k);
    if (p) permitRow(p, now);
  }
  for (const [k, tr] of rowEls) {
    if (!state.permits.has(k)) {
      if (tr.contains(document.activeElement)) $("#notice").focus();
      tr.remove();
      rowEls.delete(k);
    }
  }
  dirty = new Set();
  dirtyAll = false;
  order();
  const total = state.permits.size;
  $("#permit-count").textContent = total ? `(${total})` : "";
  $("#no-permits").hidden = total > 0;
  countShown();
  drawConfirmChange();
  document.body.dataset.rendered = String(total);
}

function countShown() {
  if (state.filter === "") { $("#filter-count").textContent = ""; return; }
  let n = 0;
  for (const p of state.permits.values()) if (matches(p.lock)) n++;
  $("#filter-count").textContent = `${n} of ${state.permits.size} permits match`;
}

// Every second: the countdowns, and overdue marks as they fall due.
setInterval(() => {
  const now = Date.now();
  for (const [k, tr] of rowEls) {
    const p = state.permits.get(k);
    if (p) drawExpiry(tr, p, now);
  }
}, 1000);

// ---- state of the stream ------------------------------------------------

function drawScope() {
  const s = state.scope;
  $("#scope").textContent = s === "" ? "All namespaces" : `Namespace ${s}`;
  document.body.classList.toggle("single-ns", s !== "");
  document.title = s === "" ? "Locks · all namespaces" : `Locks · ${s}`;
}

function drawLive() {
  const live = $("#live");
  if (state.connected) {
    live.className = "";
    live.replaceChildren(el("span", { class: "marker live", text: "live" }), " Updated as it happens");
  } else {
    live.className = "down";
    live.replaceChildren(el("span", { class: "marker", text: "disconnected" }),
      " Lost the connection to queenlock dashboard: reconnecting. The rows show what was last seen.");
  }
}

const sourceText = {
  connecting: (s) => `${s.source}: connecting…`,
  broken: (s) => `${s.source}: the watch is broken since ${fmtTime(s.since)} (${s.message}). Retrying; what is shown may be out of date.`,
  forbidden: (s) => `${s.source}: not shown. The Kubernetes API refused to list them for you (${s.message}).`,
};

function drawProblems() {
  const items = [];
  // Permits first: without them the page shows nothing at all.
  const rank = (s) => (s.kind === "permit" ? 0 : s.kind === "waiter" ? 1 : 2);
  for (const s of [...state.sources.values()].sort((a, b) => rank(a) - rank(b) || (a.source < b.source ? -1 : 1))) {
    if (s.state === "live") continue;
    const li = el("li", null, el("span", { class: "marker", text: s.state }), " ", sourceText[s.state] ? sourceText[s.state](s) : `${s.source}: ${s.state}`);
    li.dataset.source = s.source;
    li.dataset.state = s.state;
    items.push(li);
  }
  const box = $("#problems");
  box.hidden = items.length === 0;
  box.replaceChildren(...(items.length ? [el("ul", null, ...items)] : []));
}

function setRows(map, rows, keyOf) {
  map.clear();
  for (const r of rows || []) map.set(keyOf(r), r);
}

const permitKey = (p) => `${p.namespace}/${p.name}`;
const waiterKey = (w) => `${w.kind}:${w.namespace}/${w.name}`;
const guardedKey = (g) => `${g.kind}:${g.namespace}/${g.name}`;
const kinds = {
  permit: { map: () => state.permits, key: permitKey },
  waiter: { map: () => state.waiters, key: waiterKey },
  guarded: { map: () => state.guarded, key: guardedKey },
};

function connect() {
  const es = new EventSource("events");
  es.addEventListener("open", () => { state.connected = true; drawLive(); });
  es.addEventListener("error", () => { state.connected = false; drawLive(); });
  es.addEventListener("snapshot", (ev) => {
    const s = JSON.parse(ev.data);
    state.scope = s.scope;
    setRows(state.permits, s.permits, permitKey);
    setRows(state.waiters, s.waiters, waiterKey);
    setRows(state.guarded, s.guarded, guardedKey);
    state.sources = new Map((s.sources || []).map((x) => [x.source, x]));
    state.access = s.access;
    state.connected = true;
    drawScope(); drawLive(); drawProblems();
    othersDirty = true; dirtyAll = true; schedule();
  });
  es.addEventListener("reset", (ev) => {
    const m = JSON.parse(ev.data);
    const k = kinds[m.kind];
    setRows(k.map(), m.rows, k.key);
    if (m.kind !== "permit") othersDirty = true;
    dirtyAll = true; schedule();
  });
  es.addEventListener("upsert", (ev) => {
    const m = JSON.parse(ev.data);
    const k = kinds[m.kind];
    k.map().set(k.key(m.row), m.row);
    if (m.kind === "permit") dirty.add(permitKey(m.row)); else othersDirty = true;
    schedule();
  });
  es.addEventListener("delete", (ev) => {
    const m = JSON.parse(ev.data);
    kinds[m.kind].map().delete(m.key);
    if (m.kind !== "permit") othersDirty = true;
    schedule();
  });
  es.addEventListener("status", (ev) => {
    const s = JSON.parse(ev.data);
    state.sources.set(s.source, s);
    drawProblems();
  });
  es.addEventListener("access", (ev) => {
    state.access = JSON.parse(ev.data);
    dirtyAll = true; schedule();
  });
}

// ---- sorting and filtering -----------------------------------------------

function drawSort() {
  for (const b of document.querySelectorAll("#permits th button[data-sort]")) {
    const th = b.parentElement;
    th.setAttribute("aria-sort", b.dataset.sort !== state.sort.key ? "none" : state.sort.dir > 0 ? "ascending" : "descending");
  }
}

for (const b of document.querySelectorAll("#permits th button[data-sort]")) {
  b.addEventListener("click", () => {
    if (state.sort.key === b.dataset.sort) state.sort.dir = -state.sort.dir;
    else state.sort = { key: b.dataset.sort, dir: 1 };
    drawSort();
    order();
  });
}

$("#filter").addEventListener("input", (ev) => {
  state.filter = ev.target.value.trim().toLowerCase();
  for (const tr of document.querySelectorAll("tbody tr")) tr.hidden = !matches(tr.dataset.lock || "");
  countShown();
});

// ---- release ------------------------------------------------------------

const dialog = $("#confirm");
let pending = null; // { key, row as seen when the dialog opened, opener }

function openConfirm(key, opener) {
  const p = state.permits.get(key);
  if (!p) return;
  pending = { key, seen: { ...p }, opener };
  const dl = $("#confirm-what");
  const item = (t, d) => [el("dt", { text: t }), el("dd", { text: d })];
  const now = Date.now();
  dl.replaceChildren(
    ...item("Lock", p.lock), ...item("Namespace", p.namespace), ...item("Slot", `${p.slot} of ${p.limit}`),
    ...item("Owner", p.owner), ...item("Holder pod", p.holderPod || "none"),
    ...item("Since", `${fmtTime(p.acquireTime)} (${ago(p.acquireTime, now)})`),
    ...item("Last renew", `${fmtTime(p.renewTime)} (${ago(p.renewTime, now)})`),
    ...item("Expires", expiry(p, now).text));
  $("#confirm-token").textContent = p.token;
  $("#confirm-changed").hidden = true;
  $("#confirm-release").disabled = false;
  $("#confirm-cancel").disabled = false;
  dialog.showModal();
  // The safe choice has the focus: Enter alone never releases.
  $("#confirm-cancel").focus();
}

// drawConfirmChange warns, while the dialog is open, that the permit it
// shows changed: a release would be refused.
function drawConfirmChange() {
  if (!pending || !dialog.open) return;
  const now = state.permits.get(pending.key);
  const warn = $("#confirm-changed");
  if (!now) {
    warn.textContent = "This permit is gone since this opened: released or expired.";
    warn.hidden = false;
  } else if (now.token !== pending.seen.token) {
    warn.textContent = `This permit changed since this opened (${describeChange(pending.seen, now)}, token now ${now.token}). Releasing will be refused: cancel and look again.`;
    warn.hidden = false;
  }
}

function describeChange(seen, now) {
  if (now.acquireTime === seen.acquireTime && now.owner === seen.owner) return `renewed by ${now.owner}`;
  return `taken over by ${now.owner}`;
}

function closeConfirm() {
  const opener = pending && pending.opener;
  pending = null;
  if (dialog.open) dialog.close();
  return opener;
}

$("#confirm-cancel").addEventListener("click", () => {
  const opener = closeConfirm();
  if (opener && document.contains(opener)) opener.focus();
});

dialog.addEventListener("cancel", (ev) => {
  // Escape: as Cancel, and the focus goes back where it came from.
  ev.preventDefault();
  $("#confirm-cancel").click();
});

$("#confirm-release").addEventListener("click", async () => {
  if (!pending) return;
  const seen = pending.seen;
  $("#confirm-release").disabled = true;
  $("#confirm-cancel").disabled = true;
  let answer;
  try {
    const res = await fetch("release", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ namespace: seen.namespace, name: seen.name, token: seen.token }),
      credentials: "same-origin",
      cache: "no-store",
    });
    answer = await res.json().catch(() => ({ released: false, reason: "error", message: `HTTP ${res.status}` }));
  } catch (e) {
    answer = { released: false, reason: "error", message: `the dashboard did not answer (${e})` };
  }
  closeConfirm();
  const what = `${seen.lock} slot ${seen.slot}${state.scope === "" ? ` in ${seen.namespace}` : ""}`;
  let text;
  if (answer.released) {
    text = `Released ${what} (token ${seen.token}, owner ${seen.owner}).`;
  } else if (answer.reason === "changed") {
    const cur = answer.current;
    text = cur ? `Not released: ${what} was ${describeChange(seen, cur)} after you looked (token ${seen.token} is now ${cur.token}). Look at it again before releasing.`
      : `Not released: ${what} changed after you looked (token ${seen.token} is no longer current).`;
  } else if (answer.reason === "gone") {
    text = `Not released: ${what} is gone already (released or expired).`;
  } else {
    text = `Not released: ${what}: ${answer.message || answer.reason}`;
  }
  // The focus goes to the outcome: the row and its button may be gone.
  showNotice(text, answer.released ? "good" : "bad", answer.released ? "released" : answer.reason);
});

function showNotice(text, tone, reason) {
  const n = $("#notice");
  n.hidden = false;
  n.className = tone;
  n.dataset.reason = reason;
  n.replaceChildren(el("span", { class: "marker", text: tone === "good" ? "done" : "not done" }), " ", text);
  n.focus();
}

drawSort();
drawLive();
connect();
