// "Notify me on this device": subscribes this browser through the service worker (/sw.js) and the Push API,
// lists the person's devices (GET /api/push/subscriptions) and removes them. Opening a world with #queue
// (what a notification links to) opens its queue.
(() => {
  const panel = document.getElementById("push");
  const button = document.getElementById("push-subscribe");
  const status = document.getElementById("push-status");
  const list = document.getElementById("push-devices");
  const API = "/api/push/subscriptions";

  function say(text) {
    if (status) status.textContent = text;
  }

  function keyBytes(key) {
    const b64 = key.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (key.length % 4)) % 4);
    return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  }

  function label() {
    const ua = navigator.userAgent;
    const browser = /Edg\//.test(ua) ? "Edge" : /Firefox\//.test(ua) ? "Firefox" : /Chrom/.test(ua) ? "Chromium" : /Safari\//.test(ua) ? "Safari" : "Browser";
    const system = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac OS/.test(ua) ? "macOS" : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "";
    return system ? `${browser} on ${system}` : browser;
  }

  async function current() {
    const reg = await navigator.serviceWorker.getRegistration("/");
    return reg ? reg.pushManager.getSubscription() : null;
  }

  async function refresh() {
    const answer = await fetch(API, { credentials: "same-origin" });
    if (!answer.ok) return null;
    const body = await answer.json();
    const mine = await current().catch(() => null);
    list.replaceChildren();
    for (const sub of body.subscriptions) {
      const item = document.createElement("li");
      const here = mine && mine.endpoint === sub.endpoint;
      item.textContent = `${sub.label || "A device"}${here ? " (this device)" : ""} · since ${sub.created.slice(0, 10)} `;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "small quiet";
      remove.textContent = "Remove";
      remove.addEventListener("click", async () => {
        const gone = await fetch(`${API}/${encodeURIComponent(sub.id)}`, { method: "DELETE", credentials: "same-origin" });
        if (here && mine) await mine.unsubscribe().catch(() => false);
        say(gone.ok ? "Removed." : "Could not remove that device.");
        refresh();
      });
      item.append(remove);
      list.append(item);
    }
    return body;
  }

  async function subscribe() {
    say("Asking this browser…");
    try {
      const permission = await Notification.requestPermission();
      if (permission !== "granted") {
        say("Notifications are blocked for this site in this browser.");
        return;
      }
      const answer = await fetch(API, { credentials: "same-origin" });
      if (!answer.ok) throw new Error(`the server said ${answer.status}`);
      const { key } = await answer.json();
      await navigator.serviceWorker.register("/sw.js", { scope: "/" });
      const reg = await navigator.serviceWorker.ready;
      say("Subscribing with the browser's push service…");
      const sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: keyBytes(key) });
      const saved = await fetch(API, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ ...sub.toJSON(), label: label() }),
      });
      if (!saved.ok) throw new Error(`the server said ${saved.status}`);
      say("This device will be notified of requests while no page of yours is open on the world.");
      refresh();
    } catch (err) {
      say(`Could not subscribe: ${err && err.message ? err.message : err}`);
    }
  }

  if (panel && button && "serviceWorker" in navigator && "PushManager" in window && "Notification" in window) {
    panel.hidden = false;
    button.addEventListener("click", subscribe);
    refresh();
  }
  if (location.hash === "#queue") {
    window.addEventListener("load", () => document.getElementById("queue-indicator")?.click());
  }
})();
