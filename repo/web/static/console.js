// sessionrepo console: the only script. It never reads or writes markup (no innerHTML):
// it marks the page as scripted, opens or closes every <details> on request, and reloads
// a page that asks for it (data-refresh="<seconds>": the health page while a rebuild runs).
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
var refreshing = document.querySelector("[data-refresh]");
if (refreshing !== null) {
  var seconds = Number(refreshing.getAttribute("data-refresh"));
  if (seconds > 0) setTimeout(function () { location.reload(); }, seconds * 1000);
}
