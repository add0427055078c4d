// The review and report pages' Print button (no inline handler: the Content-Security-Policy
// allows scripts of our own origin only).
document.addEventListener("click", (event) => {
  if (event.target instanceof Element && event.target.closest("[data-print]")) window.print();
});
