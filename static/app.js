/* Agent World page: the little that htmx cannot do by itself.
 * - resume the socket from the last seq the page showed (reconnects included);
 * - upserts: a fragment for an element the page does not have yet is appended where it belongs;
 * - the approval queue (modal, keyboard, focus trap, title count, notifications);
 * - client tools (ui_notify) run here and answer over the socket. */
(function () {
  "use strict";
  var socket = null;          // htmx-ext-ws's public interface of the page's socket
  var currentId = null;       // the approval shown in the modal
  var currentIndex = 0;
  var dismissed = false;      // the user closed the modal: do not reopen it until the queue empties
  var known = null;           // approval ids seen, to notify only about new ones
  var lastFocus = null;

  function $(sel, root) { return (root || document).querySelector(sel); }
  function $$(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }
  function root() { return document.getElementById("world"); }
  function canDecide() { var r = root(); return !!r && r.dataset.canDecide === "true"; }

  // Reconnect sooner than the extension's default (up to ~64 s): full jitter, capped at 8 s.
  htmx.config.wsReconnectDelay = function (retry) { return Math.random() * Math.min(8000, 500 * Math.pow(2, retry)); };

  // -- the socket's URL: always resume after the last seq shown ------------------------------
  htmx.createWebSocket = function (url) {
    var seq = document.getElementById("seq");
    var u = new URL(url, location.href);
    if (seq) u.searchParams.set("after", seq.dataset.seq || "0");
    var s = new WebSocket(u.toString(), []);
    s.binaryType = htmx.config.wsBinaryType;
    return s;
  };

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
    refresh(false);
  });

  // -- connection state -----------------------------------------------------------------------
  function setConnection(state, text) {
    var c = document.getElementById("connection");
    if (c) { c.dataset.state = state; c.textContent = text; }
  }
  document.addEventListener("htmx:wsOpen", function (e) {
    socket = e.detail.socketWrapper;
    setConnection("live", "live");
  });
  document.addEventListener("htmx:wsClose", function () { setConnection("reconnecting", "reconnecting…"); });

  function send(obj) {
    if (!socket) return false;
    socket.send(JSON.stringify(obj));
    return true;
  }

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
  function runClientCalls() {
    $$("#client-calls [data-call-id]:not([data-started])").forEach(function (el) {
      el.setAttribute("data-started", "");
      var args = {};
      try { args = JSON.parse(el.dataset.args || "{}"); } catch (err) { args = {}; }
      var tool = clientTools[el.dataset.name];
      var result = tool ? tool(args) : { error: "this page cannot run " + el.dataset.name };
      if (canDecide()) {
        send({ type: "tool_result", quiet: true,
               message: { role: "tool", tool_call_id: el.dataset.callId, content: JSON.stringify(result) } });
      }
    });
  }

  // -- the approval queue -------------------------------------------------------------------------
  function items() { return $$("#approval-list > .approval:not([data-placeholder])"); }
  function modal() { return document.getElementById("approval-modal"); }
  function isOpen() { var m = modal(); return !!m && !m.hidden; }

  function show(index) {
    var list = items();
    if (!list.length) { currentId = null; return; }
    currentIndex = Math.max(0, Math.min(index, list.length - 1));
    list.forEach(function (el, i) { el.classList.toggle("current", i === currentIndex); });
    currentId = list[currentIndex].id;
    var pos = document.getElementById("queue-pos");
    if (pos) pos.textContent = String(currentIndex + 1);
  }

  function focusCurrent() {
    var cur = currentId && document.getElementById(currentId);
    var target = cur && (cur.querySelector("button.choice") || cur);
    if (!target) target = $(".modal-box button.close");
    if (target) { if (!target.hasAttribute("tabindex") && target === cur) cur.tabIndex = -1; target.focus(); }
  }

  function open(id) {
    var m = modal();
    if (!m || !items().length) return;
    if (!isOpen()) lastFocus = document.activeElement;
    m.hidden = false;
    dismissed = false;
    var list = items();
    var at = id ? list.findIndex(function (el) { return el.id === "approval-" + id || el.id === id; }) : -1;
    show(at >= 0 ? at : currentIndex);
    focusCurrent();
  }

  function close(byUser) {
    var m = modal();
    if (!m || m.hidden) return;
    m.hidden = true;
    if (byUser) dismissed = true;
    if (lastFocus && document.body.contains(lastFocus)) lastFocus.focus();
  }

  function refresh(initial) {
    var list = items();
    var n = list.length;
    var count = document.getElementById("queue-count");
    if (count) count.textContent = String(n);
    var total = document.getElementById("queue-total");
    if (total) total.textContent = String(n);
    var ind = document.getElementById("queue-indicator");
    if (ind) ind.classList.toggle("has-pending", n > 0);
    var name = (document.getElementById("world-name") || {}).textContent || "World";
    document.title = (n ? "(" + n + ") " : "") + name.trim() + " — Agent World";

    var ids = list.map(function (el) { return el.id; });
    var fresh = known ? ids.filter(function (id) { return !known.has(id); }) : [];
    known = new Set(ids);
    if (fresh.length) notify(fresh);

    if (!n) { dismissed = false; close(false); currentId = null; currentIndex = 0; }
    else {
      var at = currentId ? ids.indexOf(currentId) : -1;
      var hadFocus = isOpen() && modal().contains(document.activeElement);
      show(at >= 0 ? at : currentIndex);
      if (isOpen() && (!hadFocus || at < 0)) focusCurrent();
      if (!isOpen() && canDecide() && !dismissed && (initial || fresh.length)) open();
    }
    runClientCalls();
    $$("#toasts > .toast").forEach(expire);
  }

  function notify(ids) {
    if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) return;
      var tool = (el.querySelector(".tool") || {}).textContent || "a tool";
      try { new Notification("Approval needed", { body: el.dataset.agent + " wants to run " + tool, tag: id }); }
      catch (err) { /* some browsers only allow notifications from a service worker */ }
    });
  }

  // -- keyboard and clicks ---------------------------------------------------------------------------
  function typing(el) {
    return el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.tagName === "SELECT" || el.isContentEditable);
  }
  function focusables() {
    return $$(".modal-box button, .modal-box input, .modal-box select, .modal-box textarea, .modal-box [tabindex]")
      .filter(function (el) { return !el.disabled && el.offsetParent !== null; });
  }
  document.addEventListener("keydown", function (e) {
    if (!isOpen()) return;
    if (e.key === "Escape") { e.preventDefault(); close(true); return; }
    if (e.key === "Tab") {  // keep focus inside the dialog
      var f = focusables();
      if (!f.length) return;
      var i = f.indexOf(document.activeElement);
      if (e.shiftKey && (i <= 0)) { e.preventDefault(); f[f.length - 1].focus(); }
      else if (!e.shiftKey && (i === -1 || i === f.length - 1)) { e.preventDefault(); f[0].focus(); }
      return;
    }
    if (typing(e.target)) {
      if (e.key === "Enter" && e.target.name === "reason") {  // Enter in the reason denies
        e.preventDefault();
        var deny = e.target.form && e.target.form.querySelector('[data-choice="deny"]');
        if (deny) deny.click();
      }
      return;
    }
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    if (e.key === "ArrowRight" || e.key === "ArrowDown") { e.preventDefault(); show(currentIndex + 1); focusCurrent(); return; }
    if (e.key === "ArrowLeft" || e.key === "ArrowUp") { e.preventDefault(); show(currentIndex - 1); focusCurrent(); return; }
    var cur = currentId && document.getElementById(currentId);
    var btn = cur && cur.querySelector('button[data-key="' + e.key.toLowerCase() + '"]');
    if (btn) { e.preventDefault(); btn.click(); }
  });

  document.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target : e.target.parentElement;
    if (!t) return;
    if (t.closest("#queue-indicator")) { if (isOpen()) close(true); else open(); return; }
    if (t.closest("[data-close-modal]")) { close(true); return; }
    var mv = t.closest("[data-move]");
    if (mv) { show(currentIndex + Number(mv.dataset.move)); focusCurrent(); return; }
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
    if (e.target === modal()) close(true);  // a click on the backdrop
  });

  // Decision forms are sent by their buttons over the socket, never submitted as a page.
  document.addEventListener("submit", function (e) {
    if (e.target.classList && e.target.classList.contains("decide")) e.preventDefault();
  }, true);

  // The message box: Enter sends, Shift+Enter is a new line; it empties once sent.
  document.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey && e.target.matches && e.target.matches("#say textarea")) {
      e.preventDefault();
      if (e.target.value.trim()) e.target.form.requestSubmit();
    }
  });
  document.addEventListener("htmx:wsAfterSend", function (e) {
    if (e.target && e.target.id === "say") e.target.reset();
  });

  function updateNotifyToggle() {
    var b = document.getElementById("notify-toggle");
    if (b) b.hidden = !("Notification" in window) || Notification.permission !== "default";
  }

  document.addEventListener("DOMContentLoaded", function () {
    updateNotifyToggle();
    var log = currentLog();
    if (log) log.scrollTop = log.scrollHeight;
    refresh(true);
  });

  // For tests and power users: the page's socket, as the page itself uses it.
  window.agentWorld = { send: send, open: open, close: close, toast: toast };
})();
