// The console's only script: live batch cards (server-sent events) and seams that seek.
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
  var scores = document.getElementById("seam-scores");
  document.querySelectorAll("button.seam").forEach(function (button) {
    button.style.left = button.getAttribute("data-left") + "%";
    button.addEventListener("click", function () {
      var at = Number(button.getAttribute("data-seconds"));
      document.querySelectorAll("video.player").forEach(function (player) {
        player.currentTime = Math.max(0, at - 0.5);
      });
      if (scores) {
        scores.textContent = "Seam " + button.getAttribute("data-seam") + " at " + at.toFixed(2) +
          " s: " + button.getAttribute("data-scores");
      }
    });
  });
})();
