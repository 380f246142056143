// The review page renews the reviewer's own claim while it is open (docs/QUEUE.md): a POST
// every third of the lease. Its URL and period are data- attributes of #df-claim.
(function () {
  "use strict";
  var banner = document.getElementById("df-claim");
  if (!banner || !banner.dataset.renewUrl) {
    return;
  }
  var token = banner.querySelector("input[name=csrfmiddlewaretoken]").value;
  var shown = document.getElementById("df-claim-until");
  var timer = setInterval(function () {
    fetch(banner.dataset.renewUrl, { method: "POST", headers: { "X-CSRFToken": token }, credentials: "same-origin" })
      .then(function (r) { return r.json().then(function (body) { return [r.ok, body]; }); })
      .then(function (answer) {
        if (answer[0]) { shown.textContent = new Date(answer[1].until).toLocaleString(); return; }
        clearInterval(timer);
        document.getElementById("df-claim-mine").textContent = answer[1].message;
        banner.className = "df-banner df-banner-warn";
      })
      .catch(function () { /* offline for a moment: the next ping tries again */ });
  }, Number(banner.dataset.renewEveryMs));
})();
