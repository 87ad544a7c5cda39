// The console's only script: live batch cards (server-sent events), seams that seek, and
// players that fall back to H.264 where the browser cannot decode a rendition (HEVC).
// Text goes in with textContent: nothing from a manifest is ever parsed as markup.
(function () {
  "use strict";
  var grid = document.querySelector("[data-live]");
  if (grid && window.EventSource) {
    var source = new EventSource(grid.getAttribute("data-live"));
    source.onmessage = function (message) {
      JSON.parse(message.data).jobs.forEach(function (job) {
        var card = document.getElementById("card-" + job.job_id);
        if (!card) { return; }
        card.className = "card stage-" + job.stage;
        var stage = card.querySelector('[data-field="stage"]');
        stage.textContent = job.stage + (job.stopped ? " (in " + job.stopped + ")" : "");
        card.querySelector('[data-field="percent"]').value = job.percent;
        card.querySelector('[data-field="segments"]').textContent = job.segments + " segments";
        var verdict = card.querySelector('[data-field="verdict"]');
        verdict.textContent = job.verdict ? "QC " + job.verdict : "";
        verdict.className = "verdict " + job.verdict;
      });
      document.body.setAttribute("data-live-updates", String(
        Number(document.body.getAttribute("data-live-updates") || 0) + 1));
    };
  }
  document.querySelectorAll(".card img").forEach(function (img) {
    img.addEventListener("error", function () { img.style.visibility = "hidden"; });
  });
  // Without this, a browser without HEVC shows a black box with an audio bar.
  document.querySelectorAll("video.player[data-type]").forEach(function (player) {
    var type = player.getAttribute("data-type");
    if (!type || player.canPlayType(type) !== "") { return; }
    var notice = player.parentNode.querySelector(".cannot-play");
    var fallback = player.getAttribute("data-fallback");
    var name = player.getAttribute("data-rendition");
    var said = "This browser cannot play the " + name + " rendition (" +
      type.replace(/^.*codecs="([^".]*).*$/, "$1") + ").";
    if (fallback) {
      said += " Showing the " + fallback + " rendition (H.264) in its place.";
      player.src = player.getAttribute("data-fallback-src");
    }
    if (notice) {
      notice.textContent = said;
      notice.hidden = false;
    }
  });
  var scores = document.getElementById("seam-scores");
  function seek(seam) {
    var at = Number(seam.getAttribute("data-seconds"));
    document.querySelectorAll("video.player").forEach(function (player) {
      player.currentTime = Math.max(0, at - 0.5);
    });
    if (scores) {
      scores.textContent = "Seam " + seam.getAttribute("data-seam") + " at " + at.toFixed(2) +
        " s: " + seam.getAttribute("data-scores");
    }
  }
  document.querySelectorAll("button.seam").forEach(function (button) {
    button.style.left = button.getAttribute("data-left") + "%";
    button.addEventListener("click", function () { seek(button); });
  });
  // Links (to the rendition at that time, without script); here they seek the players.
  document.querySelectorAll("a.seam-cell").forEach(function (link) {
    link.addEventListener("click", function (event) {
      if (!document.querySelector("video.player")) { return; }
      event.preventDefault();
      seek(link);
    });
  });
})();
