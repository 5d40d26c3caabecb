/* comgra: clicks on graph nodes and keyboard navigation along the graph.
 *
 * A click on a node (or Enter/Space on a focused node) writes the node's id into
 * the "node-click" store; the arrow keys press the navigation buttons, except
 * while the user types in a field or works a slider or dropdown. After the graph
 * re-renders, focus follows the selected node if it was inside the graph. */
(function () {
  "use strict";
  var KEYS = { ArrowLeft: "nav-left", ArrowRight: "nav-right", ArrowUp: "nav-up", ArrowDown: "nav-down" };
  var BUSY = '[role="slider"], [role="combobox"], [role="listbox"], [role="tablist"], .dash-dropdown, ' +
             '.dash-slider, .rc-slider, .js-plotly-plot';

  function select(nodeId) {
    var dc = window.dash_clientside;
    if (dc && dc.set_props) {
      dc.set_props("node-click", { data: { id: nodeId, t: Date.now() } });
    }
  }

  function nodeOf(element) {
    var node = element && element.closest ? element.closest("[data-node]") : null;
    return node && node.closest("#dependency-graph") ? node : null;
  }

  function busy(element) {
    if (!element || element === document.body) return false;
    var tag = element.tagName;
    if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || element.isContentEditable) return true;
    return !!(element.closest && element.closest(BUSY));
  }

  document.addEventListener("click", function (event) {
    var node = nodeOf(event.target);
    if (node) select(node.getAttribute("data-node"));
  });

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    var node = nodeOf(event.target);
    if (node && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      select(node.getAttribute("data-node"));
      return;
    }
    var button = KEYS[event.key];
    if (!button || (!node && busy(event.target))) return;
    var panel = document.getElementById("panel-tensors");
    if (!panel || panel.classList.contains("hidden")) return;
    var element = document.getElementById(button);
    if (!element) return;
    event.preventDefault();
    element.click();
  });

  function followFocus(graph) {
    var hadFocus = false;
    graph.addEventListener("focusin", function () { hadFocus = true; });
    graph.addEventListener("focusout", function (event) {
      if (event.relatedTarget && !graph.contains(event.relatedTarget)) hadFocus = false;
    });
    new MutationObserver(function () {
      if (!hadFocus) return;
      var active = document.activeElement;
      if (active && active !== document.body && !graph.contains(active)) { hadFocus = false; return; }
      var selected = graph.querySelector(".graph-node.selected");
      if (selected && selected !== active) selected.focus({ preventScroll: true });
    }).observe(graph, { childList: true, subtree: true, attributes: true, attributeFilter: ["class"] });
  }

  var waiting = new MutationObserver(function () {
    var graph = document.getElementById("dependency-graph");
    if (graph) {
      waiting.disconnect();
      followFocus(graph);
    }
  });
  waiting.observe(document.documentElement, { childList: true, subtree: true });
})();
