// sessionrepo console: the only script. It never reads or writes markup (no innerHTML):
// it marks the page as scripted and opens or closes every <details> on request.
"use strict";
document.documentElement.classList.add("js");
document.addEventListener("click", function (event) {
  var target = event.target;
  if (!(target instanceof HTMLElement)) return;
  var action = target.getAttribute("data-toggle-details");
  if (action === null) return;
  document.querySelectorAll("#transcript details").forEach(function (element) {
    element.open = action === "open";
  });
});
