/* The files panel (templates/_files.html): the list follows the workspace (a tool's result or an upload swaps
   #files-changed in over the live channel, and the folder shown is listed again), previews open in a dialog,
   and members upload by button or by dropping files on the panel (the raw bytes, POSTed to the JSON API). */
(function () {
  "use strict";
  var panel = document.getElementById("files-panel");
  if (!panel) return;
  var world = panel.dataset.world, chat = panel.dataset.chat;
  var dialog = document.getElementById("file-dialog");
  var status = document.getElementById("files-status");
  var MAX = 25 * 1024 * 1024;
  var waiting = null;

  function folder() {
    var list = document.getElementById("files-list");
    return list ? list.dataset.path || "" : "";
  }
  function refresh() {
    // Several results in a burst: one listing after the last of them.
    if (waiting) clearTimeout(waiting);
    waiting = setTimeout(function () {
      waiting = null;
      var url = "/w/" + encodeURIComponent(world) + "/files?path=" + encodeURIComponent(folder());
      htmx.ajax("GET", url, { target: "#files-list", swap: "outerHTML" });
    }, 150);
  }
  new MutationObserver(function (changes) {
    changes.forEach(function (change) {
      Array.prototype.forEach.call(change.addedNodes, function (node) {
        if (node.id === "files-changed") refresh();
      });
    });
  }).observe(panel, { childList: true });

  document.body.addEventListener("htmx:afterSwap", function (e) {
    if (e.detail.target && e.detail.target.id === "file-preview-body" && !dialog.open) dialog.showModal();
  });
  dialog.addEventListener("click", function (e) {
    if (e.target.closest("[data-close-file]")) dialog.close();
  });

  function say(text) {
    if (status) status.textContent = text;
  }
  function upload(files) {
    var base = folder();
    Array.prototype.forEach.call(files, function (file) {
      if (file.size > MAX) {
        say(file.name + " is larger than 25 MiB: not uploaded.");
        return;
      }
      var path = base ? base + "/" + file.name : file.name;
      say("Uploading " + file.name + "…");
      fetch("/api/worlds/" + encodeURIComponent(world) + "/files?path=" + encodeURIComponent(path) +
            "&chat=" + encodeURIComponent(chat), {
        method: "POST", body: file, credentials: "same-origin",
        headers: { "Content-Type": "application/octet-stream" }
      }).then(function (answer) {
        if (answer.ok) {
          say("Uploaded " + path + ".");
          return;
        }
        return answer.json().then(function (body) {
          say("Not uploaded: " + ((body.error && body.error.message) || answer.status));
        }, function () { say("Not uploaded: HTTP " + answer.status); });
      }, function () { say("Not uploaded: the server could not be reached."); });
    });
  }
  if (panel.dataset.canUpload !== "true") return;
  var input = document.getElementById("files-input");
  input.addEventListener("change", function () {
    upload(input.files);
    input.value = "";
  });
  panel.addEventListener("dragover", function (e) {
    if (e.dataTransfer && Array.prototype.indexOf.call(e.dataTransfer.types, "Files") >= 0) {
      e.preventDefault();
      panel.classList.add("files-dropping");
    }
  });
  panel.addEventListener("dragleave", function (e) {
    if (!panel.contains(e.relatedTarget)) panel.classList.remove("files-dropping");
  });
  panel.addEventListener("drop", function (e) {
    panel.classList.remove("files-dropping");
    if (!e.dataTransfer || !e.dataTransfer.files.length) return;
    e.preventDefault();
    upload(e.dataTransfer.files);
  });
})();
