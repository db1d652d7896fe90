/* Light or dark before the first paint: the saved choice, else the system's (prefers-color-scheme).
 * Loaded in <head> without defer so the page never flashes the other theme; app.js runs the toggle. */
(function () {
  "use strict";
  var saved = null;
  try { saved = localStorage.getItem("agent-world.theme"); } catch (_err) { /* private mode */ }
  var dark = saved ? saved === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
})();
