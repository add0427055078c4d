// Brakeline's live plumbing, shared by every page (no build step, no framework):
// - one websocket (/ws/live/) with subscriptions, reconnect with backoff and catch-up;
// - "live regions": server-rendered parts that are fetched again when an event concerns them;
// - the worker/beat health banner, ticking ages, and the action dialog for buttons.
// The server decides what is shown and which buttons exist; this file only moves bytes.
(function () {
  "use strict";

  const indicator = document.getElementById("live-indicator");
  const listeners = [];            // {family: "metrics" | "*", handler}
  const reconnectHooks = [];
  const topics = new Map();        // "job:5" -> {subscribe: "job", id: 5}
  const refused = [];
  let socket = null;
  let attempts = 0;
  let everOpen = false;

  function setIndicator(state, text) {
    if (!indicator) return;
    indicator.className = "live " + state;
    indicator.textContent = text;
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function subscribe(kind, id) {
    const key = kind + ":" + id;
    if (topics.has(key)) return;
    const message = { subscribe: kind, id: id };
    topics.set(key, message);
    send(message);
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/live/");
    socket.onopen = function () {
      attempts = 0;
      setIndicator("on", "live");
      topics.forEach(send);
      // Catch-up: whatever happened while the socket was down is fetched again.
      if (everOpen) reconnectHooks.forEach(function (hook) { hook(); });
      everOpen = true;
    };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "refused") refused.push(message);
      const family = (message.type || "").split(".")[0];
      listeners.forEach(function (l) {
        if (l.family === "*" || l.family === family) l.handler(message);
      });
    };
    socket.onclose = function (event) {
      if (event.code === 4401) { setIndicator("off", "logged out"); return; }
      // Exponential backoff with jitter, capped: a restarting server is not stampeded.
      const delay = Math.min(15000, 500 * Math.pow(2, attempts)) * (0.75 + Math.random() / 2);
      attempts += 1;
      setIndicator("off", "reconnecting…");
      setTimeout(connect, delay);
    };
  }

  function on(family, handler) { listeners.push({ family: family, handler: handler }); }
  function onReconnect(hook) { reconnectHooks.push(hook); }

  // --- Live regions ----------------------------------------------------------------------
  function topicsOf(element) {
    try { return JSON.parse(element.dataset.liveTopics || "[]"); } catch (e) { return []; }
  }

  function bindRegion(element) {
    topicsOf(element).forEach(function (t) { subscribe(t[0], t[1]); });
  }

  const refreshing = new Map();  // region id -> {busy, again}

  async function refreshRegion(id) {
    const state = refreshing.get(id) || { busy: false, again: false };
    refreshing.set(id, state);
    if (state.busy) { state.again = true; return; }
    const current0 = document.getElementById(id);
    // A region may ask for a minimum interval (the dashboard: at most one refresh a second).
    const gap = parseInt((current0 && current0.dataset.liveMinInterval) || "0", 10);
    const wait = (state.at || 0) + gap - Date.now();
    if (wait > 0) {
      if (!state.timer) {
        state.timer = setTimeout(function () { state.timer = null; refreshRegion(id); }, wait);
      }
      return;
    }
    state.at = Date.now();
    state.busy = true;
    try {
      const current = document.getElementById(id);
      if (!current) return;
      const response = await fetch(current.dataset.livePartial, { credentials: "same-origin" });
      if (!response.ok) return;
      const holder = document.createElement("template");
      holder.innerHTML = (await response.text()).trim();
      const fresh = holder.content.getElementById(id);
      const active = document.activeElement;
      const typing = active && current.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
      if (fresh && !typing) {
        current.replaceWith(fresh);
        bindRegion(fresh);
        tick();
      } else if (fresh) {
        state.again = true;  // someone is typing in it: try again shortly
      }
    } catch (error) {
      // The banner and the indicator say the server is away; the next event retries.
    } finally {
      state.busy = false;
      if (state.again) { state.again = false; setTimeout(function () { refreshRegion(id); }, 300); }
    }
  }

  function regionsFor(family) {
    return Array.from(document.querySelectorAll("[data-live-partial]")).filter(function (el) {
      const events = el.dataset.liveEvents;
      return !events || events.split(",").indexOf(family) >= 0;
    });
  }

  function setUpRegions() {
    const regions = Array.from(document.querySelectorAll("[data-live-partial]"));
    regions.forEach(function (el) {
      bindRegion(el);
      const poll = parseInt(el.dataset.livePoll || "0", 10);
      if (poll > 0) setInterval(function () { refreshRegion(el.id); }, poll);
    });
    on("*", function (message) {
      const family = (message.type || "").split(".")[0];
      if (["subscribed", "refused", "pong", "error", "unsubscribed"].indexOf(family) >= 0) return;
      regionsFor(family).forEach(function (el) { refreshRegion(el.id); });
    });
    onReconnect(function () { regions.forEach(function (el) { refreshRegion(el.id); }); });
  }

  // --- Ticking ages ----------------------------------------------------------------------
  function age(seconds) {
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s";
    return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
  }

  function tick() {
    const now = Date.now();
    document.querySelectorAll("[data-ago]").forEach(function (el) {
      const at = Date.parse(el.dataset.ago);
      el.textContent = isNaN(at) ? "never" : age(Math.max(0, Math.round((now - at) / 1000))) + " ago";
    });
    document.querySelectorAll("[data-until]").forEach(function (el) {
      const at = Date.parse(el.dataset.until);
      if (isNaN(at)) return;
      const left = Math.round((at - now) / 1000);
      el.textContent = left > 0 ? "in " + age(left) : "due";
    });
  }

  // --- Health banner -----------------------------------------------------------------------
  const banner = document.getElementById("health-banner");

  async function checkHealth() {
    if (!banner) return;
    const problems = [];
    try {
      const response = await fetch("/api/v1/health", { credentials: "same-origin" });
      const report = await response.json();
      if (report.workers && report.workers.stale) {
        problems.push("No Celery worker is answering: new points are not evaluated and no breaker fires.");
      }
      if (report.beat && report.beat.stale) {
        const beatAge = report.beat.last_run_age_seconds;
        problems.push("The watchdog beat " + (beatAge === null ? "has never run" :
          "last ran " + age(Math.round(beatAge)) + " ago") +
          ": heartbeat timeouts and unacknowledged commands are not being checked.");
      }
    } catch (error) {
      problems.push("The console server cannot be reached: what you see may be out of date.");
    }
    banner.hidden = problems.length === 0;
    banner.textContent = problems.join(" ");
  }

  // --- Buttons: ask for the fields the server listed, POST, show the answer ----------------
  const dialog = document.getElementById("act-dialog");
  let pending = null;

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }

  function field(spec) {
    const label = document.createElement("label");
    label.textContent = spec.label;
    let input;
    if (spec.choices) {
      input = document.createElement("select");
      spec.choices.forEach(function (c) {
        const option = document.createElement("option");
        option.value = c[0]; option.textContent = c[1];
        if (c[2]) option.dataset.body = JSON.stringify(c[2]);  // merged in when picked
        input.appendChild(option);
      });
    } else {
      input = document.createElement("textarea");
      input.rows = 2;
    }
    input.name = spec.name;
    input.required = !!spec.required;
    label.appendChild(input);
    return label;
  }

  function openDialog(button) {
    pending = button;
    document.getElementById("act-title").textContent = button.dataset.title || button.textContent;
    const fields = document.getElementById("act-fields");
    fields.innerHTML = "";
    JSON.parse(button.dataset.ask || "[]").forEach(function (spec) { fields.appendChild(field(spec)); });
    document.getElementById("act-error").textContent = "";
    document.getElementById("act-submit").textContent = button.textContent;
    document.getElementById("act-submit").className = button.className.replace("act", "").trim();
    dialog.showModal();
    const first = fields.querySelector("textarea, select");
    if (first) first.focus();
  }

  function bodyFrom(button, form) {
    const body = JSON.parse(button.dataset.body || "{}");
    form.querySelectorAll("#act-fields [name]").forEach(function (input) {
      if (input.value === "" && !input.required) return;
      const path = input.name.split(".");
      let target = body;
      path.slice(0, -1).forEach(function (key) { target = target[key] = target[key] || {}; });
      target[path[path.length - 1]] = input.value;
      const option = input.selectedOptions && input.selectedOptions[0];
      if (option && option.dataset.body) merge(body, JSON.parse(option.dataset.body));
    });
    return body;
  }

  function merge(target, extra) {
    Object.keys(extra).forEach(function (key) {
      const value = extra[key];
      if (value && typeof value === "object" && !Array.isArray(value)) {
        if (!target[key] || typeof target[key] !== "object") target[key] = {};
        merge(target[key], value);
      } else {
        target[key] = value;
      }
    });
  }

  // A refusal's fields ({"params.factor": "must be …"}) as text a person reads.
  function fieldsText(fields) {
    if (!fields || typeof fields !== "object") return "";
    return Object.keys(fields).map(function (key) {
      const why = fields[key];
      return key + ": " + (Array.isArray(why) ? why.join(" ") : typeof why === "object" ? JSON.stringify(why) : why);
    }).join("; ");
  }

  // POST a body; "" when it was accepted (the live regions are refreshed), else why not.
  async function postAction(url, body) {
    try {
      const response = await fetch(url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify(body),
      });
      if (response.ok) {
        // The websocket will say what happened next; refresh now for the acting person.
        document.querySelectorAll("[data-live-partial]").forEach(function (el) { refreshRegion(el.id); });
        return "";
      }
      const answer = await response.json().catch(function () { return {}; });
      const why = fieldsText(answer.fields);
      return (answer.detail || ("Refused (" + response.status + ")")) + (why ? " (" + why + ")" : "");
    } catch (e) {
      return "The server cannot be reached; nothing was sent.";
    }
  }

  async function submit(event) {
    event.preventDefault();
    const form = event.target;
    if (!form.reportValidity() || !pending) return;
    const button = pending;
    const error = document.getElementById("act-error");
    error.textContent = "Sending…";
    error.textContent = await postAction(button.dataset.url, bodyFrom(button, form));
    if (!error.textContent) dialog.close();
  }

  // A one-click button (nothing to ask): sent at once; a refusal is said next to it.
  async function sendNow(button) {
    if (button.disabled) return;
    button.disabled = true;
    let note = button.nextElementSibling;
    if (!note || !note.classList.contains("act-error")) {
      note = document.createElement("span");
      note.className = "act-error error";
      button.after(note);
    }
    note.textContent = "";
    note.textContent = await postAction(button.dataset.url, JSON.parse(button.dataset.body || "{}"));
    button.disabled = false;
  }

  // An inline form (a note, a pause's reason): its named fields, sent as they are.
  async function submitInline(event) {
    const form = event.target.closest("form.act-inline");
    if (!form) return;
    event.preventDefault();
    const body = {};
    form.querySelectorAll("[name]").forEach(function (input) { body[input.name] = input.value; });
    const error = form.querySelector(".act-error");
    error.textContent = "Sending…";
    error.textContent = await postAction(form.dataset.url, body);
    if (!error.textContent) form.reset();
  }

  if (dialog) {
    document.addEventListener("click", function (event) {
      const button = event.target.closest("button.act");
      if (!button) return;
      if (button.dataset.now === "true") sendNow(button); else openDialog(button);
    });
    document.addEventListener("submit", submitInline);
    document.getElementById("act-form").addEventListener("submit", submit);
    document.getElementById("act-cancel").addEventListener("click", function () { dialog.close(); });
  }

  // --- Browser notifications: a new L3/L4 alert in the person's teams (on-call and above,
  // once they allowed it with the button; the browser only asks after a click). -------------
  const notified = [];

  function setUpBrowserNotifications() {
    const teams = document.getElementById("notify-teams");
    if (!teams || !("Notification" in window)) return;
    JSON.parse(teams.textContent).forEach(function (id) { subscribe("team", id); });
    const offer = document.getElementById("notify-offer");
    if (offer && Notification.permission === "default") offer.hidden = false;
    const enable = document.getElementById("notify-enable");
    if (enable) enable.addEventListener("click", function () {
      Notification.requestPermission().then(function () { if (offer) offer.hidden = true; });
    });
    const seen = new Set();  // the job and the team group both carry the same event
    on("alert", function (message) {
      const a = message.alert;
      if (!a || ["alert.raised", "alert.escalated"].indexOf(message.type) < 0) return;
      if (["L3", "L4"].indexOf(a.severity) < 0 || Notification.permission !== "granted") return;
      const key = a.id + ":" + a.severity;
      if (seen.has(key)) return;
      seen.add(key);
      const title = a.severity + " " + a.job.name + ": " + a.rule.name;
      const shown = new Notification(title, {
        body: a.description + " (step " + a.step + ")", tag: "alert-" + key,
        requireInteraction: true,
      });
      shown.onclick = function () { window.focus(); location.href = "/jobs/" + a.job.id + "/"; };
      notified.push(title);
    });
  }

  window.Brakeline = {
    notified: notified,
    on: on, onReconnect: onReconnect, subscribe: subscribe, refused: refused,
    refreshRegion: refreshRegion, tick: tick,
    get connected() { return !!socket && socket.readyState === WebSocket.OPEN; },
  };

  if (indicator) {
    setUpRegions();
    setUpBrowserNotifications();
    connect();
    tick();
    setInterval(tick, 1000);
    checkHealth();
    setInterval(checkHealth, 10000);
  }
})();
