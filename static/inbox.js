/* The inbox (issue #31 item 7): the requests waiting for the signed-in person in all their worlds, live.
 *
 * `/inbox/ws` sends {"type": "inbox", "total", "counts": {world: n}, "html"?} whenever the list changes;
 * the list is merged by id, so a request being decided keeps what was typed into it. On the worlds list
 * (`data-view="counts"`) only the counts and the tab title change. A decision goes back over the socket,
 * only while it is open (never queued for a reconnect), and the server applies it as the queue's would.
 */
(function () {
  "use strict";
  var ws = null;
  var live = false;
  var retry = 0;

  function root() { return document.getElementById("inbox"); }
  function $$(sel, el) { return Array.prototype.slice.call((el || document).querySelectorAll(sel)); }

  function toast(text, level) {
    var box = document.getElementById("toasts");
    if (!box) return;
    var t = document.createElement("div");
    t.className = "toast toast-" + (level || "info");
    t.setAttribute("role", level === "error" ? "alert" : "status");
    t.textContent = text;
    box.appendChild(t);
    setTimeout(function () { t.remove(); }, 6000);
  }

  function setState(state, text) {
    live = state === "live";
    var c = document.getElementById("inbox-connection");
    if (c) { c.dataset.state = state; c.textContent = text; }
    $$("#inbox-list button.choice").forEach(function (b) { b.disabled = !live; });
  }

  function connect() {
    var r = root();
    if (!r) return;
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/inbox/ws" +
      (r.dataset.view === "counts" ? "?view=counts" : "");
    ws = new WebSocket(url);
    ws.onopen = function () { retry = 0; setState("live", "live"); };
    ws.onmessage = function (e) {
      var frame;
      try { frame = JSON.parse(e.data); } catch (_err) { return; }
      if (frame.type === "inbox") show(frame);
      else if (frame.type === "error") toast(frame.message, "error");
    };
    ws.onclose = function (e) {
      ws = null;
      if (e.code === 1008) { setState("ended", "signed out — reload the page"); return; }
      setState("reconnecting", "reconnecting…");
      retry += 1;
      setTimeout(connect, Math.random() * Math.min(8000, 500 * Math.pow(2, retry)));
    };
  }

  function show(frame) {
    var r = root();
    var base = r.dataset.title || document.title.replace(/^\(\d+\) /, "");
    r.dataset.title = base;
    document.title = (frame.total ? "(" + frame.total + ") " : "") + base;
    $$("[data-pending-world]").forEach(function (el) {
      var n = (frame.counts || {})[el.dataset.pendingWorld] || 0;
      el.textContent = n ? n + " waiting" : "";
      el.hidden = !n;
    });
    var total = document.getElementById("inbox-total");
    if (total) { total.textContent = String(frame.total); }
    if (typeof frame.html === "string") merge(frame.html);
    var empty = document.getElementById("inbox-empty");
    if (empty) empty.hidden = !!frame.total;
  }

  /* Put the server's list in place, keeping the nodes of requests still listed (and what was typed in them). */
  function merge(html) {
    var list = document.getElementById("inbox-list");
    if (!list) return;
    var tpl = document.createElement("template");
    tpl.innerHTML = html;
    var fresh = tpl.content.querySelector("#inbox-list");
    if (!fresh) return;
    var keep = {};
    Array.prototype.slice.call(fresh.children).forEach(function (li, i) {
      var node = document.getElementById(li.id);
      if (!node) node = li;
      else if (!node.contains(document.activeElement) && node.querySelector(".votes") &&
               node.innerHTML !== li.innerHTML) { node.replaceWith(li); node = li; }  // its votes changed
      keep[node.id] = true;
      if (list.children[i] !== node) list.insertBefore(node, list.children[i] || null);
    });
    Array.prototype.slice.call(list.children).forEach(function (li) { if (!keep[li.id]) li.remove(); });
    $$("#inbox-list button.choice").forEach(function (b) { b.disabled = !live; });
  }

  function edited(item) {
    var out = {};
    var fields = $$("textarea[name=edit]", item);
    var el, i;
    for (i = 0; i < fields.length; i++) {
      el = fields[i];
      if (el.dataset.json === "true") {
        try { out[el.dataset.arg] = JSON.parse(el.value); }
        catch (_err) { toast(el.dataset.arg + " is not valid JSON: nothing was decided.", "error"); return null; }
      } else out[el.dataset.arg] = el.value;
    }
    return out;
  }

  function choose(item, choice) {
    if (!item) return;
    var section = item.querySelector(".approval");
    if (!live || !ws) { toast("Not connected: nothing was decided.", "warning"); return; }
    var tool = section.dataset.tool;
    var confirmText = null;
    if (choice === "approve_session") confirmText = "Approve every " + tool + " call in this chat from now on?";
    else if (choice === "approve_always") confirmText = "Always approve " + tool + " calls matching these patterns?";
    else if (section.dataset.hidden && (choice === "approve_once" || choice === "approve_edited")) {
      confirmText = "This call holds disguised characters (" + section.dataset.hidden + "). Approve it all the same?";
    }
    if (confirmText && !window.confirm(confirmText)) return;
    var msg = { type: "decide", world: item.dataset.world, approval: section.dataset.approval, choice: choice };
    if (choice === "approve_edited") { msg.arguments = edited(item); if (!msg.arguments) return; }
    var reason = item.querySelector("input[name=reason]");
    if (choice === "deny" && reason && reason.value.trim()) msg.reason = reason.value.trim();
    if (choice === "approve_always") {
      msg.match = {};
      $$("[name=match]", item).forEach(function (el) { msg.match[el.dataset.arg] = el.value; });
    }
    ws.send(JSON.stringify(msg));
  }

  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest("#inbox-list button[data-choice]");
    if (b) { e.preventDefault(); choose(b.closest(".inbox-item"), b.dataset.choice); }
  });
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.key === "Enter" && t.name === "reason" && t.closest && t.closest("#inbox-list") && !e.isComposing) {
      e.preventDefault();
      choose(t.closest(".inbox-item"), "deny");
    }
  });
  document.addEventListener("submit", function (e) {
    if (e.target.closest && e.target.closest("#inbox-list")) e.preventDefault();
  });
  document.addEventListener("DOMContentLoaded", connect);
})();
