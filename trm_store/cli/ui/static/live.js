// Follows the event log: when /api/stream says the head moved, fetch this page's address again
// (only its <main>, rendered and escaped by the server) and swap it in. No reload, no framework.
(function () {
  "use strict";
  var badge = document.getElementById("live");
  var main = document.getElementById("main");
  if (!main || !window.EventSource) { return; }
  var busy = false, again = false;

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { headers: { "X-TRM-Fragment": "1" }, cache: "no-store" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        if (fresh) { main.replaceWith(fresh); main = fresh; }
      })
      .catch(function () {})
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  var source = new EventSource("/api/stream?after=" + encodeURIComponent(main.dataset.head || "0"));
  source.addEventListener("head", refresh);
  source.onopen = function () { if (badge) { badge.className = "live on"; } };
  source.onerror = function () { if (badge) { badge.className = "live off"; } };
})();
