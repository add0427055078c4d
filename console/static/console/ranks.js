// The job page's ranks table: its pages, sorts and search fetched as the server's partial
// (?partial=ranks) and swapped in place; a rank's number draws its line on the charts.
(function () {
  "use strict";

  function section() { return document.getElementById("ranks"); }

  function paramsOf(href) {
    const url = new URL(href, window.location.href), params = new URLSearchParams();
    ["sort", "q", "page"].forEach(function (key) { if (url.searchParams.get(key)) params.set(key, url.searchParams.get(key)); });
    return params;
  }

  async function show(params) {
    const current = section();
    if (!current) return;
    current.classList.add("loading");
    try {
      const response = await fetch(current.dataset.partial + "&" + params, { credentials: "same-origin" });
      if (!response.ok) throw new Error("ranks " + response.status);
      const holder = document.createElement("div");
      holder.innerHTML = (await response.text()).trim();
      const fresh = holder.querySelector("#ranks");
      if (fresh) current.replaceWith(fresh);
      const kept = new URLSearchParams(window.location.search);
      ["sort", "q", "page"].forEach(function (key) { kept.delete(key); if (params.get(key)) kept.set(key, params.get(key)); });
      const query = kept.toString();
      history.replaceState(null, "", window.location.pathname + (query ? "?" + query : "") + "#ranks");
    } finally {
      current.classList.remove("loading");
    }
  }

  document.addEventListener("click", function (event) {
    const link = event.target.closest("#ranks a");
    if (!link || event.metaKey || event.ctrlKey || event.shiftKey) return;
    if (link.classList.contains("pick-rank")) {
      if (!window.BrakelineCharts) return;
      event.preventDefault();
      window.BrakelineCharts.pickRank(parseInt(link.dataset.rank, 10));
      document.getElementById("charts").scrollIntoView();
      return;
    }
    event.preventDefault();
    show(paramsOf(link.href));
  });

  document.addEventListener("submit", function (event) {
    const form = event.target.closest("#ranks form");
    if (!form) return;
    event.preventDefault();
    const params = new URLSearchParams(new FormData(form));
    if (!params.get("q")) params.delete("q");
    show(params);
  });
  document.addEventListener("change", function (event) {
    if (event.target.matches("#ranks select[name=sort]")) event.target.form.requestSubmit();
  });
})();
