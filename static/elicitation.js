/* Answers to MCP servers' questions (templates/_elicitation.html): the form's values, typed as its schema
   says, go over the page's socket as a `role: "tool"` message; the server checks them again. */
(function () {
  "use strict";
  function value(field) {
    var type = field.dataset.type, widget = field.dataset.widget;
    var inputs = field.querySelectorAll("input, select");
    if (widget === "checkbox") return inputs[0].checked;
    if (widget === "multi") {
      return Array.prototype.filter.call(inputs, function (i) { return i.checked; }).map(function (i) { return i.value; });
    }
    var raw = inputs[0].value;
    if (raw === "") return undefined;
    if (type === "number" || type === "integer") return Number(raw);
    return raw;
  }
  function answer(form, action) {
    var out = { action: action }, content = {}, problems = [];
    if (action === "accept" && form.dataset.mode !== "url") {  // a URL question's answer is the action alone
      form.querySelectorAll("[data-field]").forEach(function (field) {
        var input = field.querySelector("input, select");
        if (input && input.willValidate && !input.checkValidity()) problems.push(input.validationMessage);
        var v = value(field);
        if (v !== undefined) content[field.dataset.field] = v;
      });
      if (problems.length) return { problems: problems };
      out.content = content;
    }
    return { answer: out };
  }
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button[data-elicit]");
    if (!button) return;
    var form = button.closest("form[data-elicitation-form]");
    var error = form.querySelector(".elicit-error");
    var built = answer(form, button.dataset.elicit);
    if (built.problems) { error.textContent = built.problems.join(" "); error.hidden = false; return; }
    var socket = window.agentWorld && window.agentWorld.send;
    var message = { role: "tool", tool_call_id: form.dataset.elicitationForm, content: JSON.stringify(built.answer) };
    if (!socket || !socket({ type: "tool_result", message: message })) {
      error.textContent = "Not connected: nothing was sent."; error.hidden = false; return;
    }
    error.hidden = true;  // the item leaves the queue when the answer is stored; a refusal comes as a toast
  });
})();
