// A new API token is shown once: a click on its field selects it whole, ready to copy.
(function () {
  "use strict";
  var field = document.getElementById("df-token-secret");
  if (field) {
    field.addEventListener("click", function () { field.select(); });
  }
})();
