// Conclave Chatter in the browser. Everything shown comes from the chat
// process's snapshots (server-sent events) and is put in the page with
// textContent: message text is never parsed as HTML.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token") || "";
  const $ = (id) => document.getElementById(id);
  const log = $("log"), input = $("input");
  let lastSeq = 0, ended = false;
  const history = [];
  let histPos = 0, draft = "";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function two(n) { return String(n).padStart(2, "0"); }
  function clock(ms) {
    const d = new Date(ms);
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function addEntry(e) {
    const row = el("div", "entry " + e.kind);
    row.dataset.seq = e.seq;
    const time = el("time", "time", clock(e.time_ms));
    time.dateTime = new Date(e.time_ms).toISOString();
    row.appendChild(time);
    row.appendChild(document.createTextNode(" "));
    if (e.kind === "message") {
      if (e.mine) row.classList.add("mine");
      row.appendChild(el("span", "sender", e.sender));
      row.appendChild(document.createTextNode(": "));
      row.appendChild(el("span", "text", e.text));
    } else {
      row.appendChild(el("span", "text", (e.kind === "warning" ? "! " : "* ") + e.text));
    }
    log.appendChild(row);
  }

  function render(s) {
    $("room").textContent = "#" + s.group;
    $("me").textContent = s.me;
    document.title = "#" + s.group + " - " + s.me + " - Conclave Chatter";
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    for (const e of s.entries) {
      if (e.seq > lastSeq) { addEntry(e); lastSeq = e.seq; }
    }
    while (log.children.length > 2000) log.removeChild(log.firstChild);
    if (atBottom) log.scrollTop = log.scrollHeight;
    const ul = $("members");
    ul.replaceChildren();
    for (const m of s.members) ul.appendChild(el("li", m === s.me ? "me" : "", m));
    // In the view but not yet in the key: waiting for the next rekey (SEAL).
    for (const m of s.waiting) ul.appendChild(el("li", "waiting", m + " (waits for rekey)"));
    $("count").textContent = s.members.length + s.waiting.length;
    $("epoch").textContent = s.epoch || "-";
    $("protocol").textContent = s.protocol;
    const key = $("key");
    key.textContent = s.fingerprint || s.key;
    key.className = s.key_state;
    const status = $("status");
    status.textContent = s.status;
    status.className = "status " + s.key_state + (s.connected ? "" : " down");
    if (s.ended) finish("chat ended: this member has quit");
  }

  function finish(why) {
    ended = true;
    $("conn").textContent = why;
    $("conn").classList.add("down");
    input.disabled = true;
  }

  const events = new EventSource("/events?token=" + encodeURIComponent(token));
  events.onopen = () => { if (!ended) { $("conn").textContent = "live"; $("conn").classList.remove("down"); } };
  events.onmessage = (m) => {
    let s;
    try { s = JSON.parse(m.data); } catch (err) { return; }
    if (s.me !== undefined) render(s);
  };
  events.onerror = () => {
    if (ended) { events.close(); return; }
    $("conn").textContent = "connection lost; retrying ...";
    $("conn").classList.add("down");
  };

  async function post(line) {
    try {
      const r = await fetch("/send?token=" + encodeURIComponent(token), {
        method: "POST", headers: { "Content-Type": "text/plain;charset=utf-8" }, body: line,
      });
      if (!r.ok) $("conn").textContent = "not sent: " + r.status + " " + (await r.text());
    } catch (err) {
      $("conn").textContent = "not sent: " + err;
    }
  }

  $("form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const line = input.value;
    if (line.trim() === "") return;
    if (history[history.length - 1] !== line) history.push(line);
    if (history.length > 500) history.shift();
    histPos = history.length; draft = "";
    input.value = "";
    post(line);
  });

  input.addEventListener("keydown", (ev) => {
    if (ev.key !== "ArrowUp" && ev.key !== "ArrowDown") return;
    ev.preventDefault();
    if (histPos === history.length) {
      if (ev.key === "ArrowDown") return;
      draft = input.value;
    }
    const pos = histPos + (ev.key === "ArrowUp" ? -1 : 1);
    if (pos < 0 || pos > history.length) return;
    histPos = pos;
    input.value = pos === history.length ? draft : history[pos];
    input.setSelectionRange(input.value.length, input.value.length);
  });
})();
