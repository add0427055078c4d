// Keeps the jobs table current: refreshes the rows from the API and ticks heartbeat ages.
(function () {
  "use strict";
  const table = document.getElementById("jobs");
  if (!table) return;

  function age(iso) {
    if (!iso) return "never";
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 60) return seconds + " s ago";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    return Math.floor(seconds / 3600) + " h ago";
  }

  function formatLoss(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "string") return value; // "NaN", "Infinity"
    return value.toPrecision(5);
  }

  function render(job) {
    let row = table.querySelector('tr[data-job-id="' + job.id + '"]');
    if (!row) {
      row = document.createElement("tr");
      row.dataset.jobId = job.id;
      row.innerHTML = '<td></td><td class="name"></td><td class="status"><span class="badge"></span></td>' +
        '<td class="step"></td><td class="loss"></td><td class="heartbeat"></td>';
      row.children[0].textContent = job.team;
      row.children[1].textContent = job.name;
      table.tBodies[0].appendChild(row);
    }
    const badge = row.querySelector(".status .badge");
    badge.textContent = job.status;
    badge.className = "badge status-" + job.status;
    row.querySelector(".step").textContent = job.current_step === null ? "–" : job.current_step;
    row.querySelector(".loss").textContent = formatLoss(job.latest_loss);
    row.querySelector(".heartbeat").dataset.at = job.last_heartbeat_at || "";
  }

  function tick() {
    table.querySelectorAll("td.heartbeat").forEach(function (cell) {
      cell.textContent = age(cell.dataset.at);
    });
  }

  async function refresh() {
    try {
      const response = await fetch(table.dataset.endpoint, { credentials: "same-origin" });
      if (response.ok) (await response.json()).forEach(render);
    } catch (error) {
      // Offline for a moment: keep the last known rows; the next refresh catches up.
    }
    tick();
  }

  refresh();
  setInterval(refresh, 2000);
  setInterval(tick, 1000);
})();
