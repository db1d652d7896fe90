/* Agent World page: the little that htmx cannot do by itself.
 * - resume the socket from the last seq the page showed (reconnects included);
 * - upserts: a fragment for an element the page does not have yet is appended where it belongs;
 * - sending: only over a live socket, never queued for a reconnect (htmx-ext-ws would replay it);
 * - back to live by itself after any outage; nothing typed is lost (drafts and held messages kept per chat);
 * - the approval queue: a native <dialog> opened only by a deliberate act, keys only while the
 *   dialog itself has focus, a second confirmation for the wide scopes (and for any call with hidden
 *   or look-alike characters), who decided first;
 * - client tools (ui_notify) run here and answer over the socket. */
(function () {
  "use strict";
  var socket = null;          // htmx-ext-ws's public interface of the page's socket
  var current = null;         // the WebSocket the page uses now (htmx-ext-ws's wrapper holds it, unexposed)
  var live = false;           // the socket is open (sends go out now, or not at all)
  var currentId = null;       // the approval shown in the dialog (null while a "decided" notice shows)
  var currentIndex = 0;
  var known = null;           // approval ids seen, to signal only new ones
  var confirming = null;      // {item, choice, message} awaiting its second confirmation

  function $(sel, root) { return (root || document).querySelector(sel); }
  function $$(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }
  function root() { return document.getElementById("world"); }
  function canDecide() { var r = root(); return !!r && r.dataset.canDecide === "true"; }

  // Reconnect sooner than the extension's default (up to ~64 s): full jitter, capped at 8 s.
  htmx.config.wsReconnectDelay = function (retry) { return Math.random() * Math.min(8000, 500 * Math.pow(2, retry)); };

  // -- the socket's URL: always resume after the last seq shown ------------------------------
  htmx.createWebSocket = function (url) {
    // A session that ended gets no more attempts: a socket that never opens nor closes.
    if (ended) return { readyState: 3, close: function () {}, send: function () {}, addEventListener: function () {} };
    var seq = document.getElementById("seq");
    var u = new URL(url, location.href);
    if (seq) u.searchParams.set("after", seq.dataset.seq || "0");
    var s = new WebSocket(u.toString(), []);
    s.binaryType = htmx.config.wsBinaryType;
    current = s;
    return s;
  };

  // -- back to live after any outage: a network blip, a sleeping laptop, a server restart ----------
  // A socket that lived through an outage may be dead without knowing it (its TCP connection gone), and
  // nothing the page sends can tell: so after one, the page opens a fresh socket, which resumes after the
  // last seq shown. The old one is closed without a word (its close is no news, and starts no retry).
  function wrapper() {
    var r = root();
    return r && r["htmx-internal-data"] && r["htmx-internal-data"].webSocket;
  }
  function freshSocket() {
    var w = wrapper();
    if (ended || !w) return;
    guardRetries(w);
    var old = current;
    if (old) {
      old.onopen = null;
      old.onclose = null;
      old.onerror = null;
      try { old.close(); } catch (_err) { /* already closed */ }
    }
    live = false;
    setConnection("reconnecting", "reconnecting…");
    updateSendability();
    w.init();
  }
  // The extension's own retry (a timer set when a socket dropped) must not replace a socket opened since.
  function guardRetries(w) {
    if (!w || w.guarded) return;
    var init = w.init;
    w.init = function () {
      if (current && current.readyState <= WebSocket.OPEN) return;  // connecting or open already
      init.call(w);
    };
    w.guarded = true;
  }

  // -- upserts: give every id-targeted fragment a target, so replays replace instead of doubling --
  function prepare(html) {
    var t = document.createElement("template");
    t.innerHTML = html;
    Array.prototype.forEach.call(t.content.children, function (el) {
      var oob = el.getAttribute("hx-swap-oob") || "true";
      if (oob.indexOf(":") > 0 || !el.id || document.getElementById(el.id)) return;
      var box = (el.dataset.appendTo && document.querySelector(el.dataset.appendTo)) || document.getElementById("scratch");
      var ph = document.createElement(el.tagName);
      ph.id = el.id;
      ph.setAttribute("data-placeholder", "");
      box.appendChild(ph);
    });
  }
  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    var log = currentLog();
    stick = !!log && log.scrollHeight - log.scrollTop - log.clientHeight < 80;
    prepare(e.detail.message);
  });
  // A streamed message's shell is sent with every chunk: only the first one (or a placeholder) takes it.
  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var first = e.detail.fragment && e.detail.fragment.firstElementChild;
    if (first && first.hasAttribute("data-if-missing") && !e.detail.target.hasAttribute("data-placeholder")) {
      e.detail.shouldSwap = false;
    }
  });

  var stick = true;
  function currentLog() { return $(".log"); }
  document.addEventListener("htmx:wsAfterMessage", function () {
    var log = currentLog();
    if (log && stick) log.scrollTop = log.scrollHeight;
    $$("#scratch > *").forEach(function (el) { el.remove(); });
    refresh();
  });

  // -- connection state: a frame goes out over the live socket now, or not at all ----------------
  function connId() { var c = document.getElementById("page-conn"); return (c && c.dataset.conn) || ""; }
  function setConnection(state, text) {
    var c = document.getElementById("connection");
    if (c) { c.dataset.state = state; c.textContent = text; }
  }
  document.addEventListener("htmx:wsOpen", function (e) {
    if (e.detail.event && e.detail.event.target !== current) return;  // a socket the page gave up on
    guardRetries(wrapper());
    socket = e.detail.socketWrapper;
    // htmx-ext-ws delivers what it queued while the socket was down right after this event: drop it.
    if (socket.queue) socket.queue.length = 0;
    // This connection's id is the server's first frame; until it comes, no decision can be sent.
    var c = document.getElementById("page-conn");
    if (c) c.dataset.conn = "";
    live = true;
    setConnection("live", "live");
    updateSendability();
  });
  document.addEventListener("htmx:wsClose", function (e) {
    if (e.detail.event && e.detail.event.target !== current) return;  // not the page's socket any more
    live = false;
    if (!ended) setConnection(navigator.onLine === false ? "offline" : "reconnecting",
                              navigator.onLine === false ? "offline" : "reconnecting…");
    updateSendability();
    checkSession(e.detail && e.detail.event && e.detail.event.code);
  });

  // -- honest connection state: a session that ended says so once, instead of retrying for ever --
  var ended = false;
  var checking = false;
  function checkSession(code) {
    var r = root();
    if (ended || checking || !r) return;
    checking = true;
    fetch("/api/me?world=" + encodeURIComponent(r.dataset.world), { credentials: "same-origin", cache: "no-store" })
      .then(function (res) {
        if (res.status === 401 || res.status === 403) endSession();
        else if (code === 1008 || code === 1000) {  // closed on purpose, not for a retry
          setConnection("offline", "disconnected — reload the page");
        }
      }, function () { /* the server is unreachable: the socket keeps retrying */ })
      .then(function () { checking = false; });
  }
  function endSession() {
    ended = true;
    setConnection("ended", "session ended");
    var banner = document.getElementById("session-ended");
    if (banner) banner.hidden = false;
  }
  // No network: nothing sent now would arrive, whatever the socket says (a connection cut while offline can
  // look open until the network is back), so the header says offline and nothing is sent until then.
  window.addEventListener("offline", function () {
    if (ended) return;
    live = false;
    setConnection("offline", "offline");
    updateSendability();
  });
  // Back online: whatever the old socket says, a fresh one (it was read as live before, and stayed
  // "reconnecting…" for good when it had outlived the outage).
  window.addEventListener("online", freshSocket);
  // A sleeping laptop (or a tab the browser froze) wakes with a socket that may be dead: the page's timer
  // finds the time it missed, and a page shown again checks at once.
  // (A hidden tab's timers may run once a minute: it reconnects once it is shown, not every minute.)
  var lastTick = Date.now();
  var missed = false;
  function checkAwake() {
    var now = Date.now();
    if (now - lastTick > 30000) missed = true;
    lastTick = now;
    if (missed && !document.hidden && root()) {
      missed = false;
      freshSocket();
    }
  }
  setInterval(checkAwake, 5000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) checkAwake(); });
  // Belt and braces: an element with ws-send never queues a frame while the socket is down.
  document.addEventListener("htmx:wsConfigSend", function (e) { if (!live) e.preventDefault(); });

  /* Sends `obj` if the socket is live (a decision carries this connection's id); false otherwise. */
  function send(obj) {
    if (!live || !socket) return false;
    if (obj && (obj.type === "decide" || obj.type === "decide_all")) obj = Object.assign({}, obj, { conn: connId() });
    try { socket.sendImmediately(JSON.stringify(obj)); } catch (_err) { return false; }
    return true;
  }
  function decisionsOn() { return canDecide() && live && !!connId(); }

  /* Decision buttons and the outbox follow the connection, and say why when they are off. */
  function updateSendability() {
    var on = decisionsOn();
    var why = live ? "Connecting…" : "Not connected to the server.";
    $$("#approval-list button.choice, #confirm-yes").forEach(function (b) {
      var item = b.closest(".approval");
      b.disabled = !on || !!(item && item.hasAttribute("data-sent"));
      if (on) b.removeAttribute("title");
      else b.title = why + " Decisions are off until the page is back.";
    });
    var off = document.getElementById("decide-offline");
    if (off) {
      off.hidden = on;
      off.textContent = why + " Decisions are switched off until the page is back; nothing clicked meanwhile is kept for later.";
    }
    updateBatch();
    $$("#outbox > li").forEach(function (li) {
      $("[data-outbox-send]", li).disabled = !live;
      $(".outbox-state", li).textContent = live ? "The page is back. Send it now?"
                                                : "Not sent: the page is offline. It waits here until you send it.";
    });
  }

  // -- nothing typed is lost: the box's draft and the outbox are kept per world and chat until sent --------
  function keptKey(kind) {
    var r = root(), chat = document.querySelector("#say [name=chat]");
    return r && chat ? "agent-world." + kind + "." + r.dataset.world + "." + chat.value : null;
  }
  function kept(kind) {
    var key = keptKey(kind);
    try { return key ? localStorage.getItem(key) : null; } catch (_err) { return null; }
  }
  function keep(kind, value) {
    var key = keptKey(kind);
    if (!key) return;
    try {
      if (value) localStorage.setItem(key, value);
      else localStorage.removeItem(key);
    } catch (_err) { /* private mode or full: this page only */ }
  }
  function keepDraft() { var box = $("#say textarea"); if (box) keep("draft", box.value); }
  function keepOutbox() {
    var held = $$("#outbox > li").map(function (li) { return li.outboxMessage.content; });
    keep("outbox", held.length ? JSON.stringify(held) : "");
  }
  document.addEventListener("input", function (e) {
    var note = document.getElementById("say-note");
    if (!(e.target.matches && e.target.matches("#say textarea"))) return;
    keepDraft();
    if (note) note.hidden = true;
  });
  // A chat asked for but gone (deleted): its draft comes along to the chat shown instead.
  function adoptDraftOf(asked, box) {
    var key = "agent-world.draft." + root().dataset.world + "." + asked, orphan = null;
    try {
      orphan = localStorage.getItem(key);
      localStorage.removeItem(key);
    } catch (_err) { /* private mode */ }
    if (!orphan) return;
    box.value = orphan + (box.value.trim() ? "\n\n" + box.value : "");
    keepDraft();
  }
  document.addEventListener("DOMContentLoaded", function () {
    var box = $("#say textarea"), chat = $("#say [name=chat]");
    if (!box || !chat) return;
    box.value = kept("draft") || box.value;
    var asked = new URLSearchParams(location.search).get("chat");
    if (asked && asked !== chat.value) adoptDraftOf(asked, box);
    var held = [];
    try { held = JSON.parse(kept("outbox") || "[]"); } catch (_err) { /* not ours: ignored */ }
    held.forEach(function (content) { if (typeof content === "string") queueOffline({ type: "say", chat: chat.value, content: content }); });
    // The message box has focus from the start (a skip link leads back to it); not on touch screens, where
    // focus would open the keyboard over the conversation.
    if (!(window.matchMedia && window.matchMedia("(pointer: coarse)").matches)) box.focus({ preventScroll: true });
  });
  // A message the server gave back (its chat was deleted meanwhile): into the box again, before what is there.
  document.addEventListener("htmx:wsAfterMessage", function () {
    $$("#say-returns > [data-content]").forEach(function (el) {
      var box = $("#say textarea"), note = document.getElementById("say-note");
      el.remove();
      if (!box) return;
      box.value = el.dataset.content + (box.value.trim() ? "\n\n" + box.value : "");
      keepDraft();
      if (note) { note.textContent = el.dataset.note; note.hidden = false; }
    });
  });

  // -- the message box: Enter sends, Shift+Enter is a new line; offline, a message waits in the outbox --
  function queueOffline(msg) {
    var li = document.createElement("li");
    li.className = "outbox-item";
    li.innerHTML = '<span class="outbox-state"></span> <q class="outbox-text"></q> ' +
      '<button type="button" class="small" data-outbox-send>Send now</button> ' +
      '<button type="button" class="small quiet" data-outbox-cancel>Cancel</button>';
    $(".outbox-text", li).textContent = msg.content;
    li.outboxMessage = msg;
    document.getElementById("outbox").appendChild(li);
    keepOutbox();
    updateSendability();
  }
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.classList && form.classList.contains("decide")) { e.preventDefault(); return; }
    if (form.id !== "say") return;
    e.preventDefault();
    var box = form.querySelector("textarea");
    if (!box.value.trim()) return;
    var msg = { type: "say", chat: form.querySelector("[name=chat]").value, content: box.value };
    if (!send(msg)) queueOffline(msg);
    form.reset();
    keepDraft();
  }, true);
  document.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.target.matches && e.target.matches("#say textarea")) {
      e.preventDefault();
      if (e.target.value.trim()) e.target.form.requestSubmit();
    }
  });
  document.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest("[data-outbox-send], [data-outbox-cancel]");
    if (!t) return;
    var li = t.closest("li");
    if (t.hasAttribute("data-outbox-cancel")) li.remove();
    else if (send(li.outboxMessage)) li.remove();
    else toast("Still offline: the message was not sent.", "warning");
    keepOutbox();
  });

  // -- tool steps: folded once their result is in (a person may open one again), with the time taken --
  function settleSteps() {
    $$(".log .step-out[data-done]:not([data-settled])").forEach(function (out) {
      out.setAttribute("data-settled", "");
      var step = out.closest(".step");
      if (step) step.open = false;
      var how = step && $(".step-how[data-started]", step), ms = $(".step-ms", out);
      var took = how ? Date.parse(out.dataset.ended) - Date.parse(how.dataset.started) : NaN;
      if (ms && Number.isFinite(took) && took >= 0) ms.textContent = " · " + (took < 1000 ? took + " ms" : (took / 1000).toFixed(1) + " s");
    });
  }
  document.addEventListener("htmx:wsAfterMessage", settleSteps);

  // -- no stuck "typing…": a streamed reply whose agent stopped streaming without storing it (an error) --
  // is marked as cut off. If its stored message does come, it replaces the whole article by id.
  function settleStreams() {
    // A reply being streamed stays below what arrives meanwhile: it is stored (and placed) when it ends,
    // so this is where it will be after a reload.
    var log = currentLog();
    if (log) $$("article.streaming", log).forEach(function (a) {
      var next = a.nextElementSibling;
      while (next && next.classList.contains("streaming")) next = next.nextElementSibling;
      if (next) log.appendChild(a);
    });
    $$(".log article.streaming[data-agent]").forEach(function (a) {
      var status = document.getElementById("status-" + a.dataset.agent);
      if (!status || status.classList.contains("state-streaming") || status.classList.contains("state-thinking")) return;
      a.classList.remove("streaming");
      a.classList.add("cut-off");
      a.setAttribute("aria-busy", "false");
      var typing = $(".typing", a);
      if (typing) typing.textContent = "(cut off: no reply was stored)";
    });
  }
  document.addEventListener("htmx:wsAfterMessage", settleStreams);
  document.addEventListener("DOMContentLoaded", settleSteps);

  // -- copy: every code block (a button after it) and every message (the button in its header) --
  function addCopyButtons() {
    $$(".log .md pre:not([data-copy-ready])").forEach(function (pre) {
      pre.setAttribute("data-copy-ready", "");
      var b = document.createElement("button");
      b.type = "button";
      b.className = "small quiet copy-code";
      b.textContent = "Copy code";
      var who = pre.closest(".item") && $(".who", pre.closest(".item"));
      b.setAttribute("aria-label", "Copy this code block" + (who ? " of " + who.textContent : ""));
      pre.insertAdjacentElement("afterend", b);
    });
  }
  function copyText(text) {
    if (!navigator.clipboard) { toast("This browser does not allow copying here.", "warning"); return; }
    navigator.clipboard.writeText(text).then(function () { toast("Copied.", "info"); },
                                             function () { toast("Copying was not allowed.", "warning"); });
  }
  document.addEventListener("click", function (e) {
    var t = e.target.closest && e.target.closest(".copy-code, [data-copy-message]");
    if (!t) return;
    if (t.classList.contains("copy-code")) { copyText(t.previousElementSibling.textContent); return; }
    var md = $(".md", t.closest(".item"));
    // biome-ignore lint/performance/useDomNodeTextContent: the copy keeps the rendered line breaks, which textContent drops
    if (md) copyText(md.innerText.trim());
  });
  document.addEventListener("htmx:wsAfterMessage", addCopyButtons);
  document.addEventListener("DOMContentLoaded", addCopyButtons);

  // -- dark mode: a toggle that persists (theme.js applied it before paint) --
  function updateThemeToggle() {
    var b = document.getElementById("theme-toggle");
    if (b) b.setAttribute("aria-pressed", String(document.documentElement.dataset.theme === "dark"));
  }
  document.addEventListener("click", function (e) {
    if (!(e.target.closest && e.target.closest("#theme-toggle"))) return;
    var theme = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = theme;
    try { localStorage.setItem("agent-world.theme", theme); } catch (_err) { /* private mode: this page only */ }
    updateThemeToggle();
  });
  document.addEventListener("DOMContentLoaded", updateThemeToggle);

  // -- the sidebar as a drawer on narrow screens --
  function setDrawer(open) {
    var r = root(), b = document.getElementById("drawer-toggle");
    if (!r || !b) return;
    r.classList.toggle("drawer-open", open);
    b.setAttribute("aria-expanded", String(open));
    var first = open && $("#sidebar a, #sidebar button, #sidebar summary");
    if (first) first.focus();
  }
  document.addEventListener("click", function (e) {
    var r = root();
    if (!r || !e.target.closest) return;
    if (e.target.closest("#drawer-toggle")) { setDrawer(!r.classList.contains("drawer-open")); return; }
    if (r.classList.contains("drawer-open") && !e.target.closest("#sidebar")) setDrawer(false);
  });
  document.addEventListener("keydown", function (e) {
    var r = root();
    if (e.key === "Escape" && r && r.classList.contains("drawer-open")) {
      setDrawer(false);
      document.getElementById("drawer-toggle").focus();
    }
  });

  // -- stop: an agent's LLM call at once; its running tool (the process is killed) after a confirmation --
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest("button[data-stop]");
    if (!b) return;
    var agent = b.dataset.stop, state = document.getElementById("status-" + agent);
    var tool = !!state && state.classList.contains("state-running_tool");
    if (tool && !window.confirm("Kill the tool " + agent + " is running? Its process is killed, and " + agent +
                                " is told who stopped it.")) return;
    if (!send({ type: "stop", agent: agent, tool: tool })) toast("Not connected: nothing was stopped.", "warning");
  });

  // -- Stop on the agent's own message: a streaming reply has it in its header; an agent of this chat that
  // thinks (or runs a tool) before any text gets a line at the end of the conversation with it. --
  function showWorking() {
    var log = currentLog(), r = root();
    if (!log || !r) return;
    $$("#agents .state[id^='status-']").forEach(function (st) {
      var agent = st.id.slice("status-".length), line = document.getElementById("working-" + agent);
      var busy = (st.classList.contains("state-thinking") || st.classList.contains("state-running_tool")) &&
                 st.dataset.chat === r.dataset.chat && !$("article.streaming[data-agent='" + agent + "']", log);
      if (!busy) { if (line) line.remove(); return; }
      if (!line) {
        line = document.createElement("div");
        line.id = "working-" + agent;
        line.className = "item item-working";
        line.setAttribute("aria-live", "off");  // the status says it already; only the button matters here
        line.innerHTML = '<header><span class="who agent"></span> <span class="working-what"></span>' +
          ' <button type="button" class="small stop">Stop</button></header>';
        $(".who", line).textContent = agent;
        $("button", line).dataset.stop = agent;
        $("button", line).setAttribute("aria-label", "Stop " + agent);
      }
      $(".working-what", line).textContent = st.textContent + "…";
      if (line !== log.lastElementChild) log.appendChild(line);
    });
  }
  document.addEventListener("htmx:wsAfterMessage", showWorking);

  // -- long output scrolls by keyboard too: a <pre> that overflows takes focus (axe: scrollable-region-focusable) --
  function focusableScrollers() {
    $$(".log pre, #approval-modal pre").forEach(function (pre) {
      var who = pre.closest(".item") && $(".who", pre.closest(".item"));
      if (!pre.hasAttribute("aria-label")) {
        pre.setAttribute("aria-label", "Code block" + (who ? " of " + who.textContent : ""));
      }
      var scrolls = pre.scrollHeight > pre.clientHeight + 1 || pre.scrollWidth > pre.clientWidth + 1;
      if (scrolls) pre.tabIndex = 0;
      else pre.removeAttribute("tabindex");
    });
  }
  document.addEventListener("htmx:wsAfterMessage", focusableScrollers);
  document.addEventListener("toggle", focusableScrollers, true);  // a step or a fold opened: its output shows
  window.addEventListener("resize", focusableScrollers);

  // -- toasts -----------------------------------------------------------------------------------
  function toast(text, level) {
    var box = document.getElementById("toasts");
    if (!box) return;
    var div = document.createElement("div");
    div.className = "toast toast-" + (level || "info");
    div.setAttribute("role", level === "error" ? "alert" : "status");
    div.textContent = text;
    box.appendChild(div);
    expire(div);
  }
  function expire(el) {
    if (el.dataset.expires) return;
    el.dataset.expires = "1";
    setTimeout(function () { el.remove(); }, el.classList.contains("toast-error") ? 8000 : 5000);
  }

  // -- client tools -----------------------------------------------------------------------------
  var clientTools = {
    ui_notify: function (args) {
      toast(String(args.message || ""), ["info", "success", "warning", "error"].indexOf(args.level) >= 0 ? args.level : "info");
      return { shown: true };
    }
  };
  function runClientTool(el) {
    var args = {};
    var tool = clientTools[el.dataset.name];
    try { args = JSON.parse(el.dataset.args || "{}"); } catch (_err) { args = {}; }
    return tool ? tool(args) : { error: "this page cannot run " + el.dataset.name };
  }
  function runClientCalls() {
    $$("#client-calls [data-call-id]:not([data-answered])").forEach(function (el) {
      // Run once; the result waits here if the page is offline.
      if (!el.hasAttribute("data-result")) el.dataset.result = JSON.stringify(runClientTool(el));
      if (!canDecide() || send({ type: "tool_result", quiet: true,
                                 message: { role: "tool", tool_call_id: el.dataset.callId, content: el.dataset.result } })) {
        el.setAttribute("data-answered", "");
      }
    });
  }

  // -- the approval queue ---------------------------------------------------------------------------
  // A request arriving never opens the dialog or moves focus: it changes the badge, the tab title, a
  // status line for screen readers, and (if chosen) a sound or a notification.
  var sentHere = {};          // approval dom ids this page sent a decision for
  function items() { return $$("#approval-list > .approval:not([data-placeholder])"); }
  function modal() { return document.getElementById("approval-modal"); }
  function isOpen() { var m = modal(); return !!m && m.open; }
  function me() { var r = root(); return (r && r.dataset.me) || ""; }
  function noticeShown() { var n = document.getElementById("approval-notice"); return !!n && !n.hidden; }

  function chatTitle(id) {
    var link = document.getElementById("chat-" + id);
    var a = link && link.querySelector("a");
    return a ? a.textContent.trim() : id;
  }
  function fillChatTitles() {
    $$("#approval-list .chat-name[data-chat-id]").forEach(function (el) {
      var title = chatTitle(el.dataset.chatId);
      if (el.textContent !== title) el.textContent = title;
    });
  }

  function setPos(text) { var pos = document.getElementById("queue-pos"); if (pos) pos.textContent = text; }

  function show(index) {
    var list = items();
    hideConfirm();
    setNotice(null);
    if (!list.length) { currentId = null; currentIndex = 0; setPos("0"); return; }
    currentIndex = Math.max(0, Math.min(index, list.length - 1));
    list.forEach(function (el, i) { el.classList.toggle("current", i === currentIndex); });
    currentId = list[currentIndex].id;
    setPos(String(currentIndex + 1));
    focusableScrollers();  // the request on screen is measured now that it shows
  }

  /* Someone else decided the request on screen: say who (and, as time goes by, how long ago), show nothing
   * decidable until the person moves on; the heading says it was decided instead of a position. */
  var decided = null;         // what the notice tells (a decided element's data), while it shows
  function setNotice(data) {
    var n = document.getElementById("approval-notice");
    if (!n) return;
    decided = data ? Object.assign({}, data) : null;
    n.hidden = !data;
    n.textContent = data ? decidedText(decided) : "";
    var where = document.getElementById("approval-where"), was = document.getElementById("approval-was");
    if (where) where.hidden = !!data;
    if (was) was.textContent = data ? "Already decided" : "";
    if (data) {
      hideConfirm();
      currentId = null;
      items().forEach(function (el) { el.classList.remove("current"); });
      setPos("–");
    }
  }
  function ago(ts) {
    var secs = Math.max(0, Math.round((Date.now() - Date.parse(ts)) / 1000));
    if (Number.isNaN(secs)) return "";
    return secs < 60 ? secs + " s ago" : secs < 3600 ? Math.round(secs / 60) + " min ago" : "at " + ts.slice(11, 19);
  }
  function decidedText(d) {
    var rest = items().length ? " Next → shows the next request." : " Nothing else is waiting.";
    var when = ago(d.ts || "");
    if (d.verb === "timed out") return "This request timed out " + when + "." + rest;
    if (!d.by) return "Decided " + when + ": " + d.text + rest;
    return (d.by || "Someone") + " " + d.verb + " this " + when + "." + rest;
  }
  setInterval(function () {  // "2 s ago" stays true while the notice shows
    var n = document.getElementById("approval-notice");
    if (decided && n && !n.hidden) n.textContent = decidedText(decided);
  }, 1000);

  function focusDialog() { var m = modal(); if (m && m.open) m.focus(); }

  function open(id) {
    var m = modal();
    var list = items();
    if (!m || !list.length) return;
    var at = id ? list.findIndex(function (el) { return el.id === "approval-" + id || el.id === id; }) : -1;
    if (!m.open) m.showModal();
    if (at >= 0 || !currentId) show(at >= 0 ? at : currentIndex);
    focusableScrollers();
    focusDialog();  // the dialog itself, never a decision button
  }
  function close() { var m = modal(); if (m && m.open) m.close(); }
  function move(step) {
    // After a "decided" notice the next request already sits at currentIndex.
    if (noticeShown()) show(step > 0 ? currentIndex : currentIndex - 1);
    else show(currentIndex + step);
    focusDialog();
  }

  function updateCount(n) {
    var count = document.getElementById("queue-count");
    if (count) count.textContent = String(n);
    var total = document.getElementById("queue-total");
    if (total) total.textContent = String(n);
    // Urgent (the badge's colour, the tab's count) only for those who can decide: a spectator just sees the count.
    var urgent = n > 0 && canDecide();
    var ind = document.getElementById("queue-indicator");
    if (ind) ind.classList.toggle("has-pending", urgent);
    var name = (document.getElementById("world-name") || {}).textContent || "World";
    var view = (root() && root().dataset.title) || "";  // a view of the world (its settings) says which
    document.title = (urgent ? "(" + n + ") " : "") + (view ? view + " — " : "") + name.trim() + " — Agent World";
  }

  /* "Approve all N" / "Deny all N": the requests listed now. Approving all leaves out a call with hidden or
   * look-alike characters (it needs its own "yes") and one this page already sent a decision for. */
  function batchItems(choice) {
    return $$("#approval-list > .approval[data-approval]").filter(function (el) {
      if (el.classList.contains("approval-decided") || el.hasAttribute("data-sent")) return false;
      if (!el.querySelector('button[data-choice="' + choice + '"]')) return false;
      return choice === "deny" || !el.dataset.hidden;
    });
  }
  function updateBatch() {
    $$("#batch button[data-batch]").forEach(function (b) {
      var n = batchItems(b.dataset.batch).length;
      b.querySelector(".batch-n").textContent = String(n);
      b.disabled = n < 2 || !decisionsOn();
    });
  }
  function callLine(el) {
    var args = $$(".args dt", el).map(function (dt) {
      var dd = dt.nextElementSibling;
      return dt.textContent.trim() + ": " + (dd ? dd.textContent.trim() : "");
    });
    return el.dataset.agent + " · " + el.dataset.tool + " · " + (args.length ? args.join(", ") : "no arguments") +
           " (chat " + chatTitle(el.dataset.chat) + ")";
  }
  function askBatch(choice) {
    var box = document.getElementById("approval-confirm");
    var list = batchItems(choice);
    if (!box || list.length < 2 || !decisionsOn()) return;
    var ol = document.getElementById("confirm-list");
    ol.replaceChildren();
    list.forEach(function (el) {
      var li = document.createElement("li");
      li.textContent = callLine(el);
      ol.appendChild(li);
    });
    ol.hidden = false;
    // Exactly these ids are sent: a request that arrives while this shows is not among them.
    confirming = { batch: list.map(function (el) { return el.dataset.approval; }), choice: choice, items: list };
    document.getElementById("confirm-text").textContent = (choice === "deny" ? "Deny" : "Approve") + " these " +
      list.length + " calls, each once?";
    document.getElementById("confirm-wider").hidden = true;
    var h = document.getElementById("confirm-hidden");
    if (h) h.hidden = true;
    list.forEach(function (el) { el.inert = true; });
    box.hidden = false;
    box.focus();
  }

  function refresh() {
    // Requests decided meanwhile leave the queue; if one was on screen, the dialog says who decided.
    $$("#approval-list > .approval-decided").forEach(function (el) {
      var onScreen = isOpen() && el.id === currentId;
      var mine = !!sentHere[el.id] && el.dataset.by === me();
      var data = Object.assign({}, el.dataset);
      el.remove();
      delete sentHere[el.id];
      if (onScreen && mine) show(currentIndex);
      else if (onScreen) setNotice(data);
    });
    var list = items();
    var n = list.length;
    updateCount(n);
    updateBatch();
    var ids = list.map(function (el) { return el.id; });
    var fresh = known ? ids.filter(function (id) { return !known.has(id); }) : [];
    known = new Set(ids);
    if (fresh.length) signal(fresh);

    if (!n && isOpen() && !noticeShown()) close();
    var at = currentId ? ids.indexOf(currentId) : -1;
    if (at >= 0) {  // keep the same request on screen (a replayed fragment replaces its element)
      currentIndex = at;
      list.forEach(function (el, i) { el.classList.toggle("current", i === at); });
      setPos(String(at + 1));
    } else if (!noticeShown()) {
      show(currentIndex);
    }
    // A swapped-out element that had focus leaves it on <body>: give it back to the dialog, not to a control.
    if (isOpen() && (!document.activeElement || document.activeElement === document.body)) focusDialog();
    fillChatTitles();
    updateSendability();
    runClientCalls();
    $$("#toasts > .toast").forEach(expire);
  }

  function signal(ids) {
    var first = document.getElementById(ids[0]);
    var what = first ? first.dataset.agent + " wants to run " + first.dataset.tool : "a tool wants to run";
    var say = document.getElementById("queue-announce");
    if (say) say.textContent = (ids.length > 1 ? ids.length + " new approval requests" : "New approval request: " + what) +
                               ". Alt+A or the pending badge opens the queue.";
    if (!canDecide()) return;  // a spectator cannot decide it: no alert, no sound, no notification
    var ind = document.getElementById("queue-indicator");
    if (ind) { ind.classList.remove("arrived"); void ind.offsetWidth; ind.classList.add("arrived"); }
    beep();
    notify(ids);
  }

  function notify(ids) {
    if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) return;
      try { new Notification("Approval needed", { body: el.dataset.agent + " wants to run " + el.dataset.tool, tag: id }); }
      catch (_err) { /* some browsers only allow notifications from a service worker */ }
    });
  }

  // -- sound: off unless the person turns it on (remembered in this browser) ----------------------------
  var audio = null;
  function soundOn() { try { return localStorage.getItem("agent-world.sound") === "on"; } catch (_err) { return false; } }
  function updateSoundToggle() {
    var b = document.getElementById("sound-toggle");
    if (!b) return;
    b.setAttribute("aria-pressed", soundOn() ? "true" : "false");
    b.textContent = soundOn() ? "Sound: on" : "Sound: off";
  }
  function beep() {
    if (!soundOn()) return;
    var osc, gain;
    try {
      audio = audio || new AudioContext();
      osc = audio.createOscillator();
      gain = audio.createGain();
      osc.frequency.value = 880;
      gain.gain.value = 0.06;
      osc.connect(gain); gain.connect(audio.destination);
      osc.start(); osc.stop(audio.currentTime + 0.18);
    } catch (_err) { /* no audio here */ }
  }

  // -- deciding -------------------------------------------------------------------------------------
  function currentItem() { return currentId ? document.getElementById(currentId) : null; }

  function choose(item, choice) {
    if (!item || !item.querySelector('[data-choice="' + choice + '"]')) return;
    if (!decisionsOn()) { toast("Not connected: nothing was decided.", "warning"); return; }
    if (choice === "approve_session" || choice === "approve_for" || choice === "approve_always") {
      if (choice === "approve_for" && !minutesOf(item)) { toast("Say for how many minutes (1 to 10080): nothing was decided.", "error"); return; }
      askConfirm(item, choice);
      return;
    }
    // A call with hidden or look-alike characters may not run what it seems to say: once needs a "yes" too.
    if (item.dataset.hidden && (choice === "approve_once" || choice === "approve_edited")) {
      if (choice === "approve_edited" && !editedArguments(item)) return;
      askConfirm(item, choice);
      return;
    }
    decide(item, choice, null);
  }

  /* Edit & approve: the arguments the person changed (JSON ones parsed), or null with a reason shown. */
  function editedArguments(item) {
    var changed = {}, n = 0, i, el;
    var fields = $$("[name=edit][data-arg]", item);
    for (i = 0; i < fields.length; i++) {
      el = fields[i];
      if (el.value === el.defaultValue) continue;
      if (el.dataset.json === "true") {
        try { changed[el.dataset.arg] = JSON.parse(el.value); }
        catch (_err) { toast(el.dataset.arg + " is not valid JSON: nothing was decided.", "error"); return null; }
      } else { changed[el.dataset.arg] = el.value; }
      n++;
    }
    if (!n) { toast("Nothing was changed: use Approve once.", "info"); return null; }
    return changed;
  }

  /* "Approve for…": the minutes the person typed (a whole number, 1 to a week), or 0. */
  function minutesOf(item) {
    var el = item.querySelector("input[name=minutes]");
    var n = el ? Number(el.value) : 0;
    return Number.isInteger(n) && n >= 1 && n <= 10080 ? n : 0;
  }

  function decide(item, choice, match) {
    var msg = { type: "decide", approval: item.dataset.approval, choice: choice };
    if (choice === "approve_for") msg.minutes = minutesOf(item);
    var edited = choice === "approve_edited" && editedArguments(item);
    if (choice === "approve_edited") { if (!edited) return; msg.arguments = edited; }
    var reason = choice === "deny" && item.querySelector("input[name=reason]");
    if (reason && reason.value.trim()) msg.reason = reason.value;
    if (match) msg.match = match;
    if (!send(msg)) { toast("Not connected: nothing was decided.", "warning"); return; }
    sentHere[item.id] = true;
    item.setAttribute("data-sent", "");  // one decision per click; the buttons come back if nothing happens
    setTimeout(function () { item.removeAttribute("data-sent"); updateSendability(); }, 4000);
    updateSendability();
  }

  /* The match an "always" decision sends: each argument's glob as the person left it (empty: any value). */
  function patternsOf(item) {
    var match = {}, wider = [];
    $$("[name=match][data-arg]", item).forEach(function (el) {
      match[el.dataset.arg] = el.value;
      if (el.value !== el.dataset.exact) {
        wider.push(el.value ? el.dataset.arg + " was `" + el.dataset.exact + "`; the pattern is `" + el.value + "`"
                            : el.dataset.arg + ": any value");
      }
    });
    return { match: match, wider: wider };
  }

  function askConfirm(item, choice) {
    var box = document.getElementById("approval-confirm");
    if (!box) return;
    var tool = item.dataset.tool, text, wider = [], match = null, p, parts, exactHost;
    // A network request's grant or rule holds its host:port (or the pattern given), not every connection.
    var reach = item.dataset.host ? item.dataset.agent + "'s connections to " + item.dataset.host : "";
    if (reach && (choice === "approve_for" || choice === "approve_session")) {
      text = "Allow " + reach + " in chat " + chatTitle(item.dataset.chat) +
             (choice === "approve_for" ? ", for the next " + minutesOf(item) + " minutes?" : ", until the chat ends?");
    } else if (choice === "approve_once" || choice === "approve_edited") {
      text = "Approve this " + tool + " call once" + (choice === "approve_edited" ? ", as edited," : "") +
             ", with the hidden or look-alike characters shown escaped in it?";
    } else if (choice === "approve_for") {
      text = "Allow every " + tool + " call in chat " + chatTitle(item.dataset.chat) + ", for " + item.dataset.agent +
             ", for the next " + minutesOf(item) + " minutes?";
    } else if (choice === "approve_session") {
      text = "Allow every " + tool + " call in chat " + chatTitle(item.dataset.chat) + ", for " + item.dataset.agent +
             ", until the chat ends?";
    } else {
      p = patternsOf(item);
      match = p.match;
      wider = p.wider;
      // A rule allows no argument it does not name; an emptied glob allows any value of its own, or none.
      parts = Object.keys(match).map(function (k) {
        return match[k] ? k + " matches `" + match[k] + "`" : k + " is anything or left out";
      });
      // The field starts as the host escaped as a glob (`[[]2001:db8::1]:443`): left so, it is that host only.
      exactHost = (item.querySelector('[name=match][data-arg="host"]') || { dataset: {} }).dataset.exact;
      text = reach && match.host ? "Allow connections to " + (match.host === exactHost ? "`" + item.dataset.host + "`"
                                                              : "hosts matching `" + match.host + "`") +
                                   " by every agent in this world, until revoked?"
           : parts.length ? "Allow " + tool + " calls whose " + parts.join(" and ") + ", with no other argument, " +
                            "for every agent in this world, until revoked?"
                          : "Allow every " + tool + " call, whatever its arguments, for every agent in this world, until revoked?";
    }
    confirming = { item: item, choice: choice, match: match };
    document.getElementById("confirm-text").textContent = text;
    var w = document.getElementById("confirm-wider");
    w.hidden = !wider.length;
    w.textContent = wider.length ? "Wider than this call: " + wider.join("; ") + "." : "";
    var h = document.getElementById("confirm-hidden");
    if (h) {
      h.hidden = !item.dataset.hidden;
      h.textContent = item.dataset.hidden ? "This call contains hidden or look-alike Unicode characters: " +
                                            item.dataset.hidden + "." : "";
    }
    item.inert = true;  // what is confirmed is what was shown: no edits underneath
    box.hidden = false;
    box.focus();  // the question, not its "yes" button
  }
  function hideConfirm() {
    var box = document.getElementById("approval-confirm");
    if (confirming && confirming.items) confirming.items.forEach(function (el) { el.inert = false; });
    else if (confirming) confirming.item.inert = false;
    var ol = document.getElementById("confirm-list");
    if (ol) { ol.hidden = true; ol.replaceChildren(); }
    confirming = null;
    if (box) box.hidden = true;
  }
  function confirmYes() {
    var c = confirming;
    hideConfirm();
    if (c && c.batch) {
      if (!send({ type: "decide_all", approvals: c.batch, choice: c.choice })) toast("Not connected: nothing was decided.", "warning");
      else c.items.forEach(function (el) { sentHere[el.id] = true; });
    } else if (c && document.body.contains(c.item)) decide(c.item, c.choice, c.match);
    focusDialog();
  }

  // The "Approve for…" button says how long; a time-boxed grant's "29 min left" counts down.
  document.addEventListener("input", function (e) {
    var t = e.target;
    if (!t.matches || !t.matches(".approval input[name=minutes]")) return;
    var btn = t.closest(".approval").querySelector('button[data-choice="approve_for"]');
    var label = btn && btn.firstChild;
    if (label && label.nodeType === 3) label.textContent = "Approve for " + (Number(t.value) || "…") + " minutes… ";
  });
  function grantsLeft() {
    $$("time.grant-left[data-ends]").forEach(function (el) {
      var s = (Date.parse(el.dataset.ends) - Date.now()) / 1000;
      var m = Math.ceil(s / 60);
      el.textContent = s <= 0 ? "ended" : m < 120 ? m + " min left" : Math.ceil(m / 60) + " h left";
    });
  }
  setInterval(grantsLeft, 15000);

  // -- keyboard and clicks ---------------------------------------------------------------------------
  function typing(el) {
    return !!el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.tagName === "SELECT" || el.isContentEditable);
  }
  document.addEventListener("keydown", function (e) {
    // Alt+A opens the queue (never decides): from anywhere but a text field, and from the message box, where
    // focus is after sending.
    var box = e.target.matches && e.target.matches("#say textarea");
    if (e.altKey && !e.ctrlKey && !e.metaKey && e.code === "KeyA") {
      if ((box || !typing(e.target)) && !isOpen()) { e.preventDefault(); open(); }
      return;
    }
    if (!isOpen()) return;
    if (typing(e.target)) {
      if (e.key === "Enter" && e.target.name === "reason" && !e.isComposing) {  // Enter in the reason denies
        e.preventDefault();
        choose(e.target.closest(".approval"), "deny");
      }
      return;
    }
    // Single keys act only while the dialog itself has focus: not a button, not a field, not the confirmation.
    if (e.target !== modal() || confirming || e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "ArrowRight" || e.key === "ArrowDown") { e.preventDefault(); move(1); return; }
    if (e.key === "ArrowLeft" || e.key === "ArrowUp") { e.preventDefault(); move(-1); return; }
    var item = currentItem();
    var btn = item && item.querySelector('button[data-key="' + e.key.toLowerCase() + '"]');
    if (btn) { e.preventDefault(); choose(item, btn.dataset.choice); }
  });

  document.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target : e.target.parentElement;
    if (!t) return;
    if (t.closest("#queue-indicator")) { if (items().length) open(); else toast("Nothing waits for a decision.", "info"); return; }
    if (t.closest("[data-close-modal]")) { close(); return; }
    var batch = t.closest("#batch button[data-batch]");
    if (batch) { askBatch(batch.dataset.batch); return; }
    if (t.closest("#confirm-yes")) { confirmYes(); return; }
    if (t.closest("#confirm-no")) { hideConfirm(); focusDialog(); return; }
    var mv = t.closest("[data-move]");
    if (mv) { move(Number(mv.dataset.move)); return; }
    var choice = t.closest("button[data-choice]");
    if (choice) { choose(choice.closest(".approval"), choice.dataset.choice); return; }
    var op = t.closest("[data-open-approval]");
    if (op) {
      if (document.getElementById("approval-" + op.dataset.openApproval)) open(op.dataset.openApproval);
      else toast("That request was already decided.", "info");
      return;
    }
    if (t.closest("#notify-toggle") && "Notification" in window) {
      Notification.requestPermission().then(updateNotifyToggle);
      return;
    }
    if (t.closest("#sound-toggle")) {
      try { localStorage.setItem("agent-world.sound", soundOn() ? "off" : "on"); } catch (_err) { /* private mode */ }
      updateSoundToggle();
      beep();  // a sample, and the click lets the browser start audio
      return;
    }
    var m = modal();
    var r = e.target === m && m.getBoundingClientRect();
    if (r) {  // a click on the backdrop closes; one on the dialog's own padding focuses it
      if (e.clientX < r.left || e.clientX > r.right || e.clientY < r.top || e.clientY > r.bottom) close();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var m = modal();
    if (m) {
      // Esc during a confirmation goes back to the request; otherwise it closes the dialog.
      m.addEventListener("cancel", function (e) { if (confirming) { e.preventDefault(); hideConfirm(); focusDialog(); } });
      m.addEventListener("close", function () { hideConfirm(); setNotice(null); });
    }
  });

  function updateNotifyToggle() {
    var b = document.getElementById("notify-toggle");
    if (b) b.hidden = !canDecide() || !("Notification" in window) || Notification.permission !== "default";
  }

  document.addEventListener("DOMContentLoaded", function () {
    updateNotifyToggle();
    updateSoundToggle();
    var log = currentLog();
    if (log) log.scrollTop = log.scrollHeight;
    refresh();
    showWorking();
    focusableScrollers();
  });

  // "Copy link" (an invite's, shown once): the clipboard where allowed, else the text selected for Ctrl+C.
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-copy]");
    if (!button) return;
    var field = document.querySelector(button.getAttribute("data-copy"));
    if (!field) return;
    field.select();
    var done = function () { button.textContent = "Copied"; };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(field.value).then(done, function () {});
    else if (document.execCommand("copy")) done();
  });

  // -- a regenerated reply's versions: "‹ version k of N ›" on the reply, the latest shown by default --------
  // Every version stays in the log and in the page: the earlier ones are moved just above the latest and
  // hidden, and the arrows show one of them in its place (marked superseded). A version arriving live
  // shows, and every version's count follows on every page.
  var versionShown = {};      // group (the first version's element id) → the version a reader chose
  var versionCounts = {};     // group → N when the reader chose (a new version shows the newest again)
  function versionOf(a) { return a.hasAttribute("data-version") ? Number(a.dataset.version) : 1; }
  function versionGroups() {  // group → its versions in the page, in order (the first has no data-version-of)
    var groups = {};
    $$(".log article[data-version-of]").forEach(function (a) {
      var key = a.dataset.versionOf;
      var first = document.getElementById(key);
      if (!groups[key]) groups[key] = first && !first.hasAttribute("data-version-of") ? [first] : [];
      groups[key].push(a);
    });
    Object.keys(groups).forEach(function (key) { groups[key].sort(function (x, y) { return versionOf(x) - versionOf(y); }); });
    return groups;
  }
  function versionNav(a, agent) {
    var nav = $(".versions", a);
    var actions = $(".message-actions", a);
    if (!nav) {
      nav = document.createElement("div");
      nav.className = "versions";
      nav.setAttribute("role", "group");
      a.insertBefore(nav, actions && actions.parentNode === a ? actions : null);
    }
    nav.setAttribute("aria-label", "Versions of " + agent + "'s reply");
    return nav;
  }
  function showVersions() {
    var groups = versionGroups();
    Object.keys(groups).forEach(function (key) {
      var members = groups[key];
      var latest = members[members.length - 1];
      var n = versionOf(latest);
      var who = $("header .who", latest);
      var agent = who ? who.textContent : "the agent";
      if (versionCounts[key] !== n) { delete versionShown[key]; versionCounts[key] = n; }
      var shown = versionShown[key] || n;
      members.forEach(function (a, i) {
        if (a !== latest && a.nextElementSibling !== members[i + 1]) latest.parentNode.insertBefore(a, latest);
        var k = versionOf(a);
        var state = k + "/" + n + "/" + shown;
        var tag = document.createElement("span");
        a.hidden = k !== shown;
        a.classList.toggle("superseded", k < n);
        var nav = versionNav(a, agent);
        if (nav.dataset.state === state) return;
        nav.dataset.state = state;
        nav.textContent = "";
        var at = members.indexOf(a);
        var button = function (step, text, label) {
          var b = document.createElement("button");
          b.type = "button";
          b.className = "small quiet";
          b.textContent = text;
          b.dataset.versionStep = String(step);
          b.setAttribute("aria-label", label);
          b.disabled = !members[at + step];
          return b;
        };
        nav.appendChild(button(-1, "‹", "Earlier version of " + agent + "'s reply"));
        var label = document.createElement("span");
        label.className = "version-count";
        label.textContent = "version " + k + " of " + n;
        nav.appendChild(label);
        nav.appendChild(button(1, "›", "Later version of " + agent + "'s reply"));
        if (k < n) {
          tag.className = "tag superseded-tag";
          tag.textContent = "superseded by version " + n;
          nav.appendChild(tag);
        }
      });
    });
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest("[data-version-step]");
    var from = b && b.closest("article");
    if (!from) return;
    var key = from.dataset.versionOf || from.id;
    var members = versionGroups()[key] || [];
    var step = Number(b.dataset.versionStep);
    var to = members[members.indexOf(from) + step];
    if (!to) return;
    versionShown[key] = versionOf(to);
    showVersions();
    // Focus stays on the arrows: the same one in the version now shown, or the other at either end.
    var same = $("[data-version-step='" + step + "']", to);
    var other = $("[data-version-step='" + -step + "']", to);
    (same && !same.disabled ? same : other).focus();
  });
  document.addEventListener("DOMContentLoaded", showVersions);
  document.addEventListener("htmx:wsAfterMessage", showVersions);

  // Edit is for one's own messages (the server refuses anyone else's): a message's fragment is the same for
  // every page, so each page hides the Edit of messages another person sent.
  function editOnlyMine() {
    $$(".log article.item-human[data-by]").forEach(function (a) {
      var edit = $("details.edit", a);
      if (edit) edit.hidden = a.dataset.by !== me();
    });
  }
  document.addEventListener("DOMContentLoaded", editOnlyMine);
  document.addEventListener("htmx:wsAfterMessage", editOnlyMine);

  // -- the header's inbox link: the person's pending total in all their worlds, from the inbox's counts socket --
  // (`/inbox/ws?view=counts`, as the worlds list uses it); it only counts, nothing here decides.
  var inboxRetry = 0;
  function watchInbox() {
    var link = document.getElementById("inbox-link");
    if (!link || ended) return;
    var ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/inbox/ws?view=counts");
    ws.onopen = function () { inboxRetry = 0; };
    ws.onmessage = function (e) {
      var frame;
      try { frame = JSON.parse(e.data); } catch (_err) { return; }
      if (frame.type !== "inbox") return;
      var total = Number(frame.total) || 0;
      var count = document.getElementById("inbox-link-total");
      if (count) { count.textContent = String(total); count.hidden = !total; }
      link.setAttribute("aria-label", total ? "Inbox: " + total + " waiting in all your worlds" : "Inbox: nothing waiting");
    };
    ws.onclose = function (e) {
      if (e.code === 1008) return;  // signed out: the page's own socket says so
      inboxRetry += 1;
      setTimeout(watchInbox, Math.random() * Math.min(8000, 500 * Math.pow(2, inboxRetry)));
    };
  }
  document.addEventListener("DOMContentLoaded", watchInbox);

  // For tests and power users: the page's socket, as the page itself uses it.
  window.agentWorld = { send: send, open: open, close: close, toast: toast };
})();
