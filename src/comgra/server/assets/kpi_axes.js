/* comgra: the Graphs tab's figures share one x-axis. They are drawn on one x-range with the same plot width
 * (server/kpi_figures.py); this keeps them so when the user zooms or pans one: the others follow its range.
 */
(function () {
  "use strict";
  var syncing = false;

  function kpiPlots() {
    return Array.prototype.slice.call(document.querySelectorAll("#kpi-graphs .js-plotly-plot"));
  }

  function follow(source, event) {
    if (syncing || !window.Plotly || !event) return;
    var touched = Object.keys(event).some(function (key) { return key.indexOf("xaxis") === 0; });
    if (!touched || !source.layout || !source.layout.xaxis) return;
    var range = (source._fullLayout && source._fullLayout.xaxis && source._fullLayout.xaxis.range) ||
      source.layout.xaxis.range;
    if (!range) return;
    syncing = true;
    var done = kpiPlots().filter(function (plot) { return plot !== source; }).map(function (plot) {
      return window.Plotly.relayout(plot, { "xaxis.range": [range[0], range[1]] });
    });
    Promise.all(done).then(function () { syncing = false; }, function () { syncing = false; });
  }

  function attach() {
    kpiPlots().forEach(function (plot) {
      if (plot.comgraAxesShared || typeof plot.on !== "function") return;
      plot.comgraAxesShared = true;
      plot.on("plotly_relayout", function (event) { follow(plot, event); });
    });
  }

  // Watch the page only until the Graphs tab's container exists, then that container alone: the Tensors tab
  // changes the page on every click, and this has nothing to do there.
  var watcher = new MutationObserver(function () {
    var container = document.getElementById("kpi-graphs");
    if (!container) return;
    watcher.disconnect();
    new MutationObserver(attach).observe(container, { childList: true, subtree: true });
    attach();
  });
  watcher.observe(document.documentElement, { childList: true, subtree: true });
  window.comgraKpiAxes = { attach: attach };
})();
