/* Find and take away (issue #31 item 8) on the world page:
 * - search: GET /api/worlds/{world}/search (redacted by the server), results listed as text;
 * - export: a plain link to the chat's Markdown (the server sends it as an attachment);
 * - @mention completion in the message box: after "@", the agents whose names start so, as a listbox
 *   (arrows move, Enter or Tab take one, Escape closes), the box saying so with aria-autocomplete.
 */
(function () {
  "use strict";
  var options = [];
  var active = -1;

  function el(id) { return document.getElementById(id); }
  function sayBox() { return document.querySelector("#say textarea"); }
  function isSayBox(t) { return !!(t && t.matches && t.matches("#say textarea")); }

  // -- search -----------------------------------------------------------------------------------
  function text(event) {
    if (typeof event.content === "string" && event.content) return event.content;
    var calls = event.tool_calls || [];
    return calls.map(function (c) { return c.function.name + " " + c.function.arguments; }).join("\n");
  }

  function showResults(found, query) {
    var list = el("find-results");
    list.textContent = "";
    found.forEach(function (event) {
      var li = document.createElement("li");
      var where = document.createElement("div");
      where.className = "find-where";
      where.textContent = (event.sender || event.agent || "").replace(/^human:/, "") + " · chat " + event.chat +
        " · " + String(event.ts || "").slice(0, 19).replace("T", " ");
      var a = document.createElement("a");
      a.href = "?chat=" + encodeURIComponent(event.chat);
      a.className = "find-hit";
      a.textContent = text(event).slice(0, 300);
      li.appendChild(where);
      li.appendChild(a);
      list.appendChild(li);
    });
    list.hidden = !found.length;
    el("find-status").textContent = found.length ? found.length + " found for “" + query + "”" : "Nothing found for “" + query + "”.";
  }

  document.addEventListener("submit", function (e) {
    if (e.target.id !== "find-form") return;
    e.preventDefault();
    var box = el("find");
    var q = el("find-q").value.trim();
    if (!q) return;
    var url = "/api/worlds/" + encodeURIComponent(box.dataset.world) + "/search?q=" + encodeURIComponent(q) +
      (el("find-this-chat").checked ? "&chat=" + encodeURIComponent(box.dataset.chat) : "");
    el("find-status").textContent = "Searching…";
    fetch(url, { credentials: "same-origin" }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (answer) {
      if (answer.ok) showResults(answer.body, q);
      else el("find-status").textContent = answer.body.error ? answer.body.error.message : "The search failed.";
    }, function () { el("find-status").textContent = "Not connected: nothing was searched."; });
  });

  // -- @mention completion ------------------------------------------------------------------------
  function agents() {
    return Array.prototype.slice.call(document.querySelectorAll("#agents > li.agent")).map(function (li) {
      return li.id.replace(/^agent-/, "");
    });
  }

  function list() {
    var ul = el("mention-list");
    if (!ul) {
      ul = document.createElement("ul");
      ul.id = "mention-list";
      ul.className = "mention-list";
      ul.setAttribute("role", "listbox");
      ul.setAttribute("aria-label", "Agents to mention");
      ul.hidden = true;
      sayBox().parentNode.appendChild(ul);
    }
    return ul;
  }

  function typedMention(box) {
    var before = box.value.slice(0, box.selectionStart);
    var m = /(^|\s)@([\w.-]*)$/.exec(before);
    return m ? m[2] : null;
  }

  function close() {
    var box = sayBox();
    var ul = el("mention-list");
    options = [];
    active = -1;
    if (ul) { ul.hidden = true; ul.textContent = ""; }
    if (box) box.removeAttribute("aria-activedescendant");
  }

  function highlight(i) {
    var box = sayBox();
    active = i;
    Array.prototype.slice.call(list().children).forEach(function (li, j) {
      li.setAttribute("aria-selected", j === i ? "true" : "false");
    });
    box.setAttribute("aria-activedescendant", "mention-opt-" + i);
  }

  function suggest() {
    var box = sayBox();
    var typed = typedMention(box);
    if (typed === null) { close(); return; }
    options = agents().filter(function (name) { return name.toLowerCase().indexOf(typed.toLowerCase()) === 0; });
    if (!options.length) { close(); return; }
    var ul = list();
    ul.textContent = "";
    options.forEach(function (name, i) {
      var li = document.createElement("li");
      li.id = "mention-opt-" + i;
      li.setAttribute("role", "option");
      li.textContent = "@" + name;
      li.addEventListener("mousedown", function (e) { e.preventDefault(); take(i); });
      ul.appendChild(li);
    });
    ul.hidden = false;
    highlight(0);
  }

  function take(i) {
    var box = sayBox();
    var name = options[i];
    if (!name) return;
    var at = box.selectionStart;
    var before = box.value.slice(0, at).replace(/@[\w.-]*$/, "@" + name + " ");
    box.value = before + box.value.slice(at);
    box.selectionStart = box.selectionEnd = before.length;
    close();
    box.dispatchEvent(new Event("input", { bubbles: true }));
  }

  document.addEventListener("input", function (e) { if (isSayBox(e.target)) suggest(); });
  // Capturing: while the list is open, its keys go to it before the page's own (Enter would send).
  document.addEventListener("keydown", function (e) {
    if (!isSayBox(e.target) || !options.length || e.isComposing) return;
    var handled = true;
    if (e.key === "ArrowDown") highlight((active + 1) % options.length);
    else if (e.key === "ArrowUp") highlight((active - 1 + options.length) % options.length);
    else if (e.key === "Enter" || e.key === "Tab") take(active);
    else if (e.key === "Escape") close();
    else handled = false;
    if (handled) { e.preventDefault(); e.stopPropagation(); }
  }, true);
  document.addEventListener("focusout", function (e) { if (isSayBox(e.target)) close(); });
  document.addEventListener("DOMContentLoaded", function () {
    var box = sayBox();
    if (!box) return;
    box.setAttribute("aria-autocomplete", "list");
    box.setAttribute("aria-controls", "mention-list");
    list();
  });
})();
