/* comgra: the dependency graph in the browser.
 *
 * The server sends each graph structure once (the "graph-documents" store, keyed by hash; see
 * server/graph_view.py for what a document holds). This script lays it out, draws it, and does
 * everything that needs no data: selecting a node (the values then come from the server: the page
 * asks the values route directly and draws the answer at once, while Dash's view callback, asked
 * the same, updates the selectors and plots), highlighting its neighbours, moving along the graph with the arrow keys
 * and the buttons, collapsing parameter boxes, zoom and pan, a hover card, and keeping the selected
 * node in view. It also keeps the page's URL in step with the selection (replaceState, no reload).
 *
 * Only what is in view is drawn: the nodes and boxes within the visible part of the graph plus a
 * margin are elements in the page, the others are drawn when they are scrolled, panned or zoomed into
 * view (at 1,000 nodes the whole graph is about 100,000 px wide, and drawing it all made every frame of
 * a click slow). The selected node and the focused one stay drawn; highlights are kept as data
 * (state.marks) and given to an element when it is drawn. ``window.COMGRA_DRAW_ALL = true`` before the
 * page loads draws everything, as before (benchmarks/app_latency.py compares both).
 */
(function () {
  "use strict";
  try {  // the "Start here" line closed in this browser (server/start_here.py): hidden before the page is drawn
    if (window.localStorage.getItem("start-here-dismissed") === "true")
      document.documentElement.classList.add("comgra-start-here-closed");
  } catch (ignored) { /* storage refused: the line shows, and its callback empties it */ }
  var NODE_W = 184, NODE_H = 40, MEMBER_W = 168, MEMBER_H = 30, COLUMN_GAP = 54, ROW_GAP = 12, PAD = 14;
  var BOX_HEAD = 18, BOX_PAD = 6, MEMBER_GAP = 4;
  var KEYS = { ArrowLeft: "left", ArrowRight: "right", ArrowUp: "up", ArrowDown: "down" };
  var BUSY = '[role="slider"], [role="combobox"], [role="listbox"], [role="tablist"], .dash-dropdown, ' +
             '.dash-slider, .rc-slider, .js-plotly-plot';
  var NOTICE_TOPICS = ["general", "trial", "rank", "type", "step", "iteration", "node", "role", "kind", "aggregation"];

  var state = {
    key: null, doc: null, badges: {}, summaries: {}, selected: null, role: null, collapsed: {},
    layout: null, byId: {}, incoming: {}, outgoing: {}, zoom: 1, rendered: "",
    selection: null, clicks: 0, asks: 0, drawnAfter: 0, stepClicks: {},
    drawn: {}, drawnBoxes: {}, marks: {}, canvas: null, pending: false
  };
  // Dark mode follows the system's preference (and its changes): Bootstrap's dark theme and comgra.css's.
  var darkQuery = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  function applyTheme() {
    document.documentElement.setAttribute("data-bs-theme", darkQuery && darkQuery.matches ? "dark" : "light");
  }
  applyTheme();
  if (darkQuery && darkQuery.addEventListener) darkQuery.addEventListener("change", applyTheme);

  var DRAW_MARGIN = 300;  // px of the screen drawn beyond each side of the visible part of the graph
  // A new structure is fitted to the pane when that keeps the labels readable (at least this zoom); a graph
  // that needs less starts at 1 and is scrolled to the selection.
  var FIT_MIN = 0.5, PANE_MIN = 300, PANE_BOTTOM_GAP = 12;
  var VALUES_ROUTE = "_comgra/values";  // server/tensors.py: VALUES_ROUTE

  // -- layout ---------------------------------------------------------------------------------
  function boxHeight(box) {
    return BOX_HEAD + BOX_PAD + (state.collapsed[box.id] ? 0 : box.members.length * (MEMBER_H + MEMBER_GAP));
  }

  function computeLayout(doc) {
    var entries = {}, attached = {}, placed = {}, columns = [];
    doc.boxes.forEach(function (box) {
      if (box.consumer && state.byId[box.consumer] && !state.byId[box.consumer].box) {
        (attached[box.consumer] = attached[box.consumer] || []).push(box);
      } else {
        (entries[box.column] = entries[box.column] || []).push({ box: box, row: 1e9 });
      }
    });
    doc.nodes.forEach(function (node) {
      if (!node.box) (entries[node.column] = entries[node.column] || []).push({ node: node, row: node.row });
    });
    var keys = Object.keys(entries).map(Number).sort(function (a, b) { return a - b; });
    var nodes = {}, boxes = {}, width = 0, height = 0;
    keys.forEach(function (column, index) {
      var x = PAD + index * (NODE_W + COLUMN_GAP), y = PAD, order = [];
      entries[column].sort(function (a, b) { return a.row - b.row; });
      function placeBox(box) {
        var h = boxHeight(box);
        boxes[box.id] = { x: x, y: y, w: NODE_W, h: h, column: index };
        var my = y + BOX_HEAD;
        box.members.forEach(function (id) {
          nodes[id] = { x: x + (NODE_W - MEMBER_W) / 2, y: my, w: MEMBER_W, h: MEMBER_H, column: index,
                        hidden: !!state.collapsed[box.id] };
          if (!state.collapsed[box.id]) order.push(id);
          my += MEMBER_H + MEMBER_GAP;
        });
        y += h + ROW_GAP;
      }
      entries[column].forEach(function (entry) {
        if (entry.node) {
          nodes[entry.node.id] = { x: x, y: y, w: NODE_W, h: NODE_H, column: index, hidden: false };
          order.push(entry.node.id);
          y += NODE_H + ROW_GAP;
          (attached[entry.node.id] || []).sort(function (a, b) { return a.id < b.id ? -1 : 1; }).forEach(placeBox);
        } else {
          placeBox(entry.box);
        }
      });
      columns.push(order);
      width = Math.max(width, x + NODE_W + PAD);
      height = Math.max(height, y + PAD);
    });
    return { nodes: nodes, boxes: boxes, columns: columns, width: width, height: height };
  }

  function index(doc) {
    state.byId = {}; state.incoming = {}; state.outgoing = {};
    doc.nodes.forEach(function (n) { state.byId[n.id] = n; state.incoming[n.id] = []; state.outgoing[n.id] = []; });
    doc.edges.forEach(function (e) {
      if (state.incoming[e.target]) state.incoming[e.target].push(e);
      if (state.outgoing[e.source]) state.outgoing[e.source].push(e);
    });
  }

  // -- drawing --------------------------------------------------------------------------------
  function el(tag, className, text) {
    var element = document.createElement(tag);
    if (className) element.className = className;
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function place(element, p) {
    element.style.left = p.x + "px"; element.style.top = p.y + "px";
    element.style.width = p.w + "px"; element.style.height = p.h + "px";
  }

  function spoken(node) {
    var parts = [node.name + (node.module_type ? " (" + node.module_type + ")" : "") +
                 (node.old ? " (previous iteration)" : ""), node.detail.split(" · ")[0]];
    if (node.roles.length > 1) parts.push(node.roles.length + " roles");
    if (node.aliases.length) parts.push("also " + node.aliases.join(", "));
    if (node.box) parts.push("in " + node.box);
    return parts.join(", ");
  }

  function drawNode(node, p) {
    var classes = ["graph-node", "role-" + node.role];
    if (!node.has_dependencies) classes.push("no-dependencies");
    if (!node.has_dependents) classes.push("no-dependents");
    if (node.box) classes.push("member");
    var element = el("div", classes.join(" "));
    place(element, p);
    element.setAttribute("data-node", node.id);
    element.setAttribute("data-node-name", node.name);
    element.setAttribute("role", "button");
    element.setAttribute("tabindex", "0");
    element.setAttribute("aria-label", spoken(node));
    element.setAttribute("aria-pressed", "false");
    element.appendChild(el("span", "node-name", node.label));
    if (!node.box) element.appendChild(el("span", "node-detail", node.detail));
    var badge = state.badges && state.badges[node.id];
    if (badge) element.appendChild(badgeMark(badge));
    var mark = state.marks[node.id];
    if (mark) {
      element.classList.add(mark);
      if (mark === "selected") element.setAttribute("aria-pressed", "true");
    }
    return element;
  }

  function badgeMark(badge) {
    var mark = el("span", "node-badge", String(badge));
    mark.setAttribute("data-badge", String(badge));
    return mark;
  }

  function drawBox(box, p) {
    var frame = el("div", "parameter-group" + (state.collapsed[box.id] ? " collapsed" : ""));
    place(frame, p);
    frame.setAttribute("data-group", box.id);
    var head = el("button", "parameter-group-label");
    head.type = "button";
    head.textContent = (state.collapsed[box.id] ? "▸ " : "▾ ") + box.label + " · " + box.members.length;
    head.title = "Parameters of " + box.id + " (click to " + (state.collapsed[box.id] ? "show" : "hide") + " them)";
    head.setAttribute("data-toggle-group", box.id);
    head.setAttribute("aria-expanded", state.collapsed[box.id] ? "false" : "true");
    frame.appendChild(head);
    return frame;
  }

  function render() {
    var graph = document.getElementById("dependency-graph");
    if (!graph) return;
    var doc = state.doc, left = graph.scrollLeft, top = graph.scrollTop;
    graph.textContent = "";
    state.drawn = {}; state.drawnBoxes = {}; state.canvas = null;
    if (!doc) {
      graph.appendChild(el("div", "graph-empty", "No graph to show."));
      state.layout = null;
      return;
    }
    sizePane(graph);
    var layout = state.layout = computeLayout(doc);
    var sizer = el("div", "graph-sizer");
    var canvas = state.canvas = el("div", "graph-canvas");
    canvas.setAttribute("data-graph", doc.hash || "");
    canvas.style.width = layout.width + "px"; canvas.style.height = layout.height + "px";
    canvas.appendChild(el("div", "graph-edges"));
    sizer.appendChild(canvas);
    graph.appendChild(sizer);
    applyZoom();
    graph.scrollLeft = left; graph.scrollTop = top;  // a box opened or closed: the view stays where it was
    drawVisible();
  }

  // The pane reaches down to the window's bottom edge (a fixed share of the window left it below the fold at
  // 1280x800, or left room unused on a tall screen).
  function sizePane(graph) {
    var top = graph.getBoundingClientRect().top + window.scrollY;
    var height = Math.max(PANE_MIN, Math.round(window.innerHeight - top - PANE_BOTTOM_GAP)) + "px";
    if (graph.style.height !== height) graph.style.height = height;
  }

  // The zoom at which the whole layout fits the pane, when it is readable; else 1.
  function fitToPane(graph) {
    if (!graph || !state.layout) return;
    var fit = Math.min(1, (graph.clientWidth - 2) / state.layout.width, (graph.clientHeight - 2) / state.layout.height);
    state.zoom = fit >= FIT_MIN ? Math.floor(fit * 100) / 100 : 1;
    applyZoom();
    drawVisible();
  }

  // The part of the layout to draw: what the scroll area shows, plus DRAW_MARGIN, in layout pixels.
  function drawnWindow(graph) {
    if (window.COMGRA_DRAW_ALL === true) return null;
    var z = state.zoom, margin = DRAW_MARGIN / z;
    return { left: graph.scrollLeft / z - margin, right: (graph.scrollLeft + graph.clientWidth) / z + margin,
             top: graph.scrollTop / z - margin, bottom: (graph.scrollTop + graph.clientHeight) / z + margin };
  }

  function inWindow(p, w) {
    return !w || (p.x + p.w >= w.left && p.x <= w.right && p.y + p.h >= w.top && p.y <= w.bottom);
  }

  // Adds the elements that came into the window and removes those that left it; the selected and the
  // focused node stay (the keyboard's place in the graph is never lost).
  function drawVisible() {
    var graph = document.getElementById("dependency-graph"), canvas = state.canvas, layout = state.layout;
    if (!graph || !canvas || !layout || !graph.contains(canvas)) return;
    var w = drawnWindow(graph), edges = canvas.querySelector(".graph-edges"), focused = document.activeElement;
    state.doc.boxes.forEach(function (box) {
      var p = layout.boxes[box.id], element = state.drawnBoxes[box.id];
      if (inWindow(p, w)) {
        if (!element) canvas.insertBefore(state.drawnBoxes[box.id] = drawBox(box, p), edges);
      } else if (element && !element.contains(focused)) {
        element.remove(); delete state.drawnBoxes[box.id];
      }
    });
    state.doc.nodes.forEach(function (node) {
      var p = layout.nodes[node.id], element = state.drawn[node.id];
      if (p && !p.hidden && (inWindow(p, w) || node.id === state.selected)) {
        if (!element) canvas.insertBefore(state.drawn[node.id] = drawNode(node, p), edges);
      } else if (element && element !== focused) {
        element.remove(); delete state.drawn[node.id];
      }
    });
  }

  // Scrolling, panning and zooming draw what came into view, once per frame.
  function drawSoon() {
    if (state.pending) return;
    state.pending = true;
    window.requestAnimationFrame(function () { state.pending = false; drawVisible(); });
  }

  function applyZoom() {
    var graph = document.getElementById("dependency-graph");
    var sizer = graph && graph.querySelector(".graph-sizer");
    var canvas = graph && graph.querySelector(".graph-canvas");
    if (!sizer || !canvas || !state.layout) return;
    canvas.style.transform = state.zoom === 1 ? "" : "scale(" + state.zoom + ")";
    sizer.style.width = state.layout.width * state.zoom + "px";
    sizer.style.height = state.layout.height * state.zoom + "px";
    graph.setAttribute("data-zoom", String(state.zoom));
  }

  function nodeElement(id) {
    var element = state.drawn[id];
    return element && element.isConnected ? element : null;
  }

  function anchor(id) {
    var p = state.layout && state.layout.nodes[id];
    if (!p) return null;
    if (p.hidden) {
      var box = state.layout.boxes[state.byId[id].box];
      return { x: box.x, y: box.y, w: box.w, h: BOX_HEAD };
    }
    return p;
  }

  function line(layer, source, target, full) {
    var s = anchor(source), t = anchor(target);
    if (!s || !t) return;
    var x1 = s.x + s.w, y1 = s.y + s.h / 2, x2 = t.x, y2 = t.y + t.h / 2;
    if (t.x <= s.x) {  // within a column or backwards: connect the facing edges vertically
      x1 = s.x + s.w / 2; x2 = t.x + t.w / 2;
      if (t.y > s.y) { y1 = s.y + s.h; y2 = t.y; } else { y1 = s.y; y2 = t.y + t.h; }
    }
    var edge = el("div", "graph-edge " + (full ? "full" : "partial"));
    edge.style.left = x1.toFixed(1) + "px"; edge.style.top = y1.toFixed(1) + "px";
    edge.style.width = Math.hypot(x2 - x1, y2 - y1).toFixed(1) + "px";
    edge.style.transform = "rotate(" + (Math.atan2(y2 - y1, x2 - x1) * 180 / Math.PI).toFixed(2) + "deg)";
    edge.setAttribute("data-edge", source + "->" + target);
    edge.setAttribute("data-weight", full ? "full" : "partial");
    edge.setAttribute("aria-hidden", "true");
    layer.appendChild(edge);
  }

  function links(id, role) {
    var result = {};
    (state.incoming[id] || []).forEach(function (e) {
      var key = e.source + "\u0000dependency";
      result[key] = result[key] || role === null || e.target_role === role;
    });
    (state.outgoing[id] || []).forEach(function (e) {
      var key = e.target + "\u0000dependent";
      result[key] = result[key] || role === null || e.source_role === role;
    });
    return result;
  }

  // Marks a node and its neighbours (as data, and on the elements drawn) and draws the edges between them.
  // ``scroll`` false: the view stays where the user scrolled it (the same node, shown again with new values).
  function highlight(id, role, scroll) {
    var graph = document.getElementById("dependency-graph");
    if (!graph || !state.doc) return;
    Object.keys(state.marks).forEach(function (other) { mark(other, null); });
    var layer = graph.querySelector(".graph-edges");
    if (layer) layer.textContent = "";
    state.selected = id; state.role = role;
    if (!id || !state.byId[id]) return;
    var node = state.byId[id];
    if (node.box && state.collapsed[node.box]) {  // a selected parameter is never hidden
      delete state.collapsed[node.box];
      render();
      layer = graph.querySelector(".graph-edges");
    }
    var all = links(id, role);
    Object.keys(all).forEach(function (key) {
      var parts = key.split("\u0000"), other = parts[0], side = parts[1];
      if (other === id) return;
      mark(other, side);
      if (layer) {
        if (side === "dependency") line(layer, other, id, all[key]); else line(layer, id, other, all[key]);
      }
    });
    mark(id, "selected");
    if (scroll === false) drawVisible(); else keepInView(id);  // draws the new selection; the one before may leave
  }

  function mark(id, side) {
    var element = nodeElement(id);
    if (side) state.marks[id] = side; else delete state.marks[id];
    if (!element) return;
    element.classList.remove("selected", "dependency", "dependent");
    if (side) element.classList.add(side);
    element.setAttribute("aria-pressed", side === "selected" ? "true" : "false");
  }

  // Scrolls the graph so that the node is in view (and drawn), unless it already is.
  function keepInView(id) {
    var scroller = document.getElementById("dependency-graph");
    var p = state.layout && state.layout.nodes[id];
    if (!scroller || !p) return;
    var z = state.zoom, left = p.x * z, top = p.y * z, right = (p.x + p.w) * z, bottom = (p.y + p.h) * z;
    var margin = 24;
    if (left < scroller.scrollLeft + margin || right > scroller.scrollLeft + scroller.clientWidth - margin) {
      scroller.scrollLeft = Math.max(0, (left + right) / 2 - scroller.clientWidth / 2);
    }
    if (top < scroller.scrollTop + margin || bottom > scroller.scrollTop + scroller.clientHeight - margin) {
      scroller.scrollTop = Math.max(0, (top + bottom) / 2 - scroller.clientHeight / 2);
    }
    drawVisible();  // now, not at the next frame: the caller may focus the element
  }

  // -- moving along the graph -------------------------------------------------------------------
  function neighbour(id, direction) {
    var layout = state.layout, here = layout && layout.nodes[id];
    if (!here) return id;
    if (direction === "up" || direction === "down") {
      var column = layout.columns[here.column], at = column.indexOf(id);
      var next = at + (direction === "up" ? -1 : 1);
      return at >= 0 && next >= 0 && next < column.length ? column[next] : id;
    }
    var sign = direction === "left" ? -1 : 1, linked = {};
    (sign < 0 ? state.incoming[id] : state.outgoing[id]).forEach(function (e) {
      linked[sign < 0 ? e.source : e.target] = true;
    });
    var side = [], preferred = [];
    Object.keys(layout.nodes).forEach(function (other) {
      var p = layout.nodes[other];
      if (p.hidden || (p.column - here.column) * sign <= 0) return;
      side.push(other);
      if (linked[other]) preferred.push(other);
    });
    var candidates = preferred.length ? preferred : side;
    if (!candidates.length) return id;
    candidates.sort(function (a, b) {
      var pa = layout.nodes[a], pb = layout.nodes[b];
      return (Math.abs(pa.column - here.column) - Math.abs(pb.column - here.column)) ||
             (Math.abs(pa.y - here.y) - Math.abs(pb.y - here.y)) || (pa.y - pb.y);
    });
    return candidates[0];
  }

  function select(id) {
    if (!state.byId[id]) return;
    var graphHadFocus = document.activeElement && document.activeElement.closest &&
                        document.activeElement.closest("#dependency-graph");
    highlight(id, id === state.selected ? state.role : null);
    if (graphHadFocus) { var e = nodeElement(id); if (e) e.focus({ preventScroll: true }); }
    askValues(id, function () {
      var dc = window.dash_clientside;
      if (dc && dc.set_props) dc.set_props("node-click", { data: { id: id, t: Date.now() } });
    });
  }

  // The clicked node's values, asked outside Dash's callback queue and drawn as soon as they come,
  // unless a later click was made or the view callback's answer was drawn meanwhile. ``then`` (the
  // view callback: selectors, plots, URL) runs after the answer, so that it never delays the values,
  // and only for the last of quick clicks, so that answers coming out of order cannot select another.
  function askValues(id, then) {
    var click = ++state.clicks;
    askEarly({ selection: state.selection, node_id: id })
      .then(function () { if (click === state.clicks) then(); });  // a later click asks for itself
  }

  // The values of the previous / next step, asked as a node click's are, and drawn first: the button's
  // Dash callback (selectors, plots, URL) follows the answer (one n_clicks per click), so that its
  // request and its larger answer never compete with the values for the server or for this page.
  function askStep(id) {
    var dc = window.dash_clientside;
    var clicks = state.stepClicks[id] = (state.stepClicks[id] || 0) + 1;
    askEarly({ selection: state.selection, trigger: STEP_BUTTONS[id] })
      .then(function () { dc.set_props(id, { n_clicks: clicks }); });
  }

  function askEarly(body) {
    var ask = ++state.asks;
    return fetch(VALUES_ROUTE, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body)
    }).then(function (response) { return response.ok ? response.json() : null; })
      .then(function (answer) {
        if (answer && answer.values && ask === state.asks && state.drawnAfter < ask) {
          state.drawnAfter = ask;
          drawValues(answer.values);
        }
      })
      .catch(function () { /* the view callback's answer draws the values all the same */ });
  }

  function move(direction) {
    if (state.selected) select(neighbour(state.selected, direction));
  }

  // -- events -----------------------------------------------------------------------------------
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

  function tensorsVisible() {
    var panel = document.getElementById("panel-tensors");
    return panel && !panel.classList.contains("hidden");
  }

  var STEP_BUTTONS = { "step-prev": "step_prev", "step-next": "step_next" };  // server/layout.py: ID.STEP_*
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("#step-prev, #step-next");
    var dc = window.dash_clientside;
    if (!button || button.disabled || !state.selection || !(dc && dc.set_props)) return;  // Dash handles it
    event.stopPropagation();  // Dash's own handler would send the button's callback at once: askStep sends it
    askStep(button.id);
  }, true);

  document.addEventListener("click", function (event) {
    var target = event.target;
    var toggle = target.closest && target.closest("[data-toggle-group]");
    if (toggle && toggle.closest("#dependency-graph")) {
      var box = toggle.getAttribute("data-toggle-group");
      if (state.collapsed[box]) delete state.collapsed[box]; else state.collapsed[box] = true;
      render(); highlight(state.selected, state.role);
      return;
    }
    var node = nodeOf(target);
    if (node) { select(node.getAttribute("data-node")); return; }
    var button = target.closest && target.closest("[data-move], [data-zoom-step]");
    if (!button) return;
    if (button.hasAttribute("data-move")) move(button.getAttribute("data-move"));
    else zoomBy(button.getAttribute("data-zoom-step"));
  });

  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    var node = nodeOf(event.target);
    if (node && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      select(node.getAttribute("data-node"));
      return;
    }
    if (shortcut(event)) return;
    var direction = KEYS[event.key];
    if (!direction || (!node && busy(event.target)) || !tensorsVisible()) return;
    event.preventDefault();
    move(direction);
  });

  // -- CSV of a table on the page: a button with data-csv-table="<id>" (numbers at full precision, from data-value)
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-csv-table]");
    if (!button) return;
    var table = document.getElementById(button.getAttribute("data-csv-table"));
    if (!table) return;
    var quote = function (text) { return /[",\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text; };
    var lines = Array.from(table.querySelectorAll("tr")).map(function (row) {
      return Array.from(row.children).map(function (cell) {
        var value = cell.getAttribute("data-value");
        return quote(value !== null && value !== "None" ? value : cell.textContent.trim());
      }).join(",");
    });
    var link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
    link.download = button.getAttribute("data-csv-name") || "comgra.csv";
    document.body.appendChild(link);
    link.click();
    window.setTimeout(function () { URL.revokeObjectURL(link.href); link.remove(); }, 1000);
  });

  // -- keyboard shortcuts: n / p (next / previous step), / (find a node), ? (this list), Escape -----------
  var SHORTCUTS = [["n", "next recorded step"], ["p", "previous recorded step"], ["/", "find a node by name"],
                   ["\u2190 \u2191 \u2193 \u2192", "move along the graph"], ["Enter", "select the focused node"],
                   ["?", "show or hide this list"], ["Esc", "close it"]];
  function shortcut(event) {
    var help = document.getElementById("shortcut-help");
    if (event.key === "Escape" && help) { help.remove(); return true; }
    if (busy(event.target)) return false;  // typing in a field, or a slider or dropdown that has the keys
    if (event.key === "?") { event.preventDefault(); toggleHelp(); return true; }
    if (!tensorsVisible()) return false;
    if (event.key === "n" || event.key === "p") {
      var button = document.getElementById(event.key === "n" ? "step-next" : "step-prev");
      if (button && !button.disabled) { event.preventDefault(); button.click(); }
      return true;
    }
    if (event.key === "/") {  // opened when the key is released: the "/" itself must not land in the search field
      event.preventDefault();
      document.addEventListener("keyup", function open(up) {
        if (up.key !== "/") return;
        document.removeEventListener("keyup", open, true);
        var search = document.getElementById("node-search");  // Dash 4: a button that opens a searchable list
        if (!search) return;
        search.focus();
        if (search.getAttribute("aria-expanded") !== "true") search.click();
      }, true);
      return true;
    }
    return false;
  }

  function toggleHelp() {
    var existing = document.getElementById("shortcut-help");
    if (existing) { existing.remove(); return; }
    var box = el("div", "shortcut-help");
    box.id = "shortcut-help";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-label", "Keyboard shortcuts");
    box.appendChild(el("div", "shortcut-title", "Keyboard shortcuts"));
    SHORTCUTS.forEach(function (entry) {
      var row = el("div", "shortcut-row");
      row.appendChild(el("kbd", "", entry[0]));
      row.appendChild(el("span", "", entry[1]));
      box.appendChild(row);
    });
    box.addEventListener("click", function () { box.remove(); });
    document.body.appendChild(box);
  }

  function zoomBy(step) {
    var graph = document.getElementById("dependency-graph");
    if (step === "fit") {
      if (!graph || !state.layout) return;
      state.zoom = Math.max(0.2, Math.min(1, graph.clientWidth / state.layout.width,
                                          Math.max(graph.clientHeight, 200) / state.layout.height));
    } else {
      state.zoom = Math.max(0.2, Math.min(2, state.zoom * (step === "in" ? 1.25 : 0.8)));
    }
    state.zoom = Math.round(state.zoom * 100) / 100;
    applyZoom();
    drawVisible();  // what a new zoom brings into view
    if (state.selected) keepInView(state.selected);
  }

  // Pan: drag the background of the graph.
  var drag = null;
  document.addEventListener("mousedown", function (event) {
    var graph = document.getElementById("dependency-graph");
    if (!graph || event.button !== 0 || !graph.contains(event.target) || nodeOf(event.target) ||
        (event.target.closest && event.target.closest("button"))) return;
    drag = { x: event.clientX, y: event.clientY, left: graph.scrollLeft, top: graph.scrollTop, graph: graph };
    graph.classList.add("panning");
  });
  document.addEventListener("mousemove", function (event) {
    if (!drag) return;
    drag.graph.scrollLeft = drag.left - (event.clientX - drag.x);
    drag.graph.scrollTop = drag.top - (event.clientY - drag.y);
  });
  document.addEventListener("mouseup", function () {
    if (drag) { drag.graph.classList.remove("panning"); drag = null; }
  });
  document.addEventListener("scroll", function (event) {  // scroll does not bubble: listen while it is captured
    if (event.target && event.target.id === "dependency-graph") drawSoon();
  }, true);
  function resizePane() {
    var graph = document.getElementById("dependency-graph");
    if (graph && state.layout && graph.offsetParent !== null) sizePane(graph);
    drawSoon();
  }
  window.addEventListener("resize", resizePane);
  // What is above the pane changes height too (a notice, a banner): its top moves, its bottom must not.
  if (window.ResizeObserver) new ResizeObserver(resizePane).observe(document.body);

  // The hover card: full name, roles, min / mean / max at this step.
  function card() {
    var existing = document.getElementById("graph-hovercard");
    if (existing) return existing;
    var created = el("div", "graph-hovercard");
    created.id = "graph-hovercard";
    created.setAttribute("role", "tooltip");
    document.body.appendChild(created);
    return created;
  }

  function number(value) {
    if (value === null || value === undefined) return "–";
    return Math.abs(value) >= 1e5 || (Math.abs(value) < 1e-3 && value !== 0) ? value.toExponential(3)
      : String(Math.round(value * 1e4) / 1e4);
  }

  document.addEventListener("mouseover", function (event) {
    var element = nodeOf(event.target);
    var hover = card();
    if (!element) { hover.style.display = "none"; return; }
    var node = state.byId[element.getAttribute("data-node")];
    if (!node) return;
    hover.textContent = "";
    hover.appendChild(el("div", "hovercard-name", node.name));
    hover.appendChild(el("div", "hovercard-detail", node.detail + (node.roles.length > 1 ? " · roles: " +
                                                                    node.roles.join(", ") : "")));
    if (node.aliases.length) hover.appendChild(el("div", "hovercard-detail", "also named " + node.aliases.join(", ")));
    var stats = state.summaries && state.summaries[node.id];
    if (stats) {
      var row = el("div", "hovercard-stats");
      ["min", "mean", "max"].forEach(function (name) {
        var cell = el("span", "", name + " " + number(stats[name]));
        cell.setAttribute("data-hover-stat", name);
        cell.setAttribute("data-value", String(stats[name]));
        row.appendChild(cell);
      });
      hover.appendChild(row);
    }
    var badge = state.badges && state.badges[node.id];
    if (badge) hover.appendChild(el("div", "hovercard-badge", "findings: " + badge));
    var box = element.getBoundingClientRect();
    hover.style.display = "block";
    hover.style.left = Math.min(window.innerWidth - 330, Math.max(4, box.left)) + "px";
    hover.style.top = (box.bottom + 6 + 90 > window.innerHeight ? box.top - 6 - hover.offsetHeight : box.bottom + 6) + "px";
  });

  // -- the URL ----------------------------------------------------------------------------------
  // The Start here strip's links open their view in this page, with no reload: the address changes and the app's
  // dcc.Location (refresh=False) tells the callbacks, as a dcc.Link does. A counter makes each click a new address,
  // so that a link followed before (the app rewrote the address since, see writeUrl) is followed again.
  var followed = 0;
  document.addEventListener("click", function (event) {
    var link = event.target && event.target.closest ? event.target.closest("a.start-here-link") : null;
    if (!link || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey ||
        event.altKey) return;  // a new tab or window: the browser's own way
    var url = new URL(link.getAttribute("href"), window.location.href);
    if (url.origin !== window.location.origin || url.pathname !== window.location.pathname) return;
    event.preventDefault();
    url.searchParams.set("go", String(++followed));
    window.history.pushState({}, "", url.pathname + url.search);
    window.dispatchEvent(new CustomEvent("_dashprivate_pushstate"));
  });

  function writeUrl(link, tab) {
    if (!link || typeof link !== "string") return window.dash_clientside.no_update;
    var query = new URLSearchParams(link.split("?")[1] || "");
    if (tab) query.set("tab", tab);
    var search = "?" + query.toString();
    if (window.location.search !== search) window.history.replaceState(window.history.state, "", search);
    return search;
  }

  // An unknown ?tab= (a typo, a tab this app lacks) opens the default tab and says so: never a blank page.
  function tabFromUrl(search) {
    var tab = new URLSearchParams(search || "").get("tab"), skip = window.dash_clientside.no_update;
    if (!tab) return [skip, ""];
    var notice = document.getElementById("tab-notice");
    var known = ((notice && notice.getAttribute("data-tabs")) || "").split(" ");
    if (known.indexOf(tab) >= 0) return [tab, ""];
    return [known[0] || "tensors", "There is no tab '" + tab.slice(0, 40) + "' (the tabs are " + known.join(", ") +
            "): showing " + (known[0] || "tensors") + "."];
  }

  // The notice goes once another tab is chosen.
  function clearTabNotice(active) {
    var notice = document.getElementById("tab-notice");
    var first = ((notice && notice.getAttribute("data-tabs")) || "").split(" ")[0];
    return active && active !== first ? "" : window.dash_clientside.no_update;
  }

  // -- the values panel (server/values_view.py says what it holds) -----------------------------------
  function renderValues(data, selection) {
    state.selection = selection || null;
    state.drawnAfter = state.asks;
    return drawValues(data);
  }

  function drawValues(data) {
    var panel = document.getElementById("values"), text = JSON.stringify(data || {});
    if (!panel) return window.dash_clientside.no_update;
    if (text === state.drawnText && panel.firstChild) return Date.now();  // drawn early from the values route
    state.drawnText = text;
    var body = el("div", "values-body");
    data = data || {};
    if (data.empty) {
      body.appendChild(el("div", "text-muted", data.empty));
    } else {
      var nav = el("nav", "breadcrumb-line");
      nav.id = "breadcrumb";
      nav.setAttribute("aria-label", "Selected tensor");
      var words = [];
      (data.crumbs || []).forEach(function (crumb, index) {
        if (index) {
          var separator = el("span", "crumb-separator", " › ");
          separator.setAttribute("aria-hidden", "true");
          nav.appendChild(separator);
        }
        var span = el("span", "crumb"), text = "";
        crumb.forEach(function (part) {
          if (!part.field) { span.appendChild(document.createTextNode(part.text)); text += part.text; return; }
          var value = el("span", "crumb-value" + (part.strong ? " crumb-strong" : "") +
                                 (part.hidden ? " visually-hidden" : ""), part.text);
          value.setAttribute("data-field", part.field);
          if (part.raw !== undefined) value.setAttribute("data-value", part.raw);
          span.appendChild(value);
          if (!part.hidden) text += part.text;
        });
        nav.appendChild(span);
        words.push(text);
      });
      nav.title = words.join(" › ");
      body.appendChild(nav);
      if (data.missing) body.appendChild(el("p", "text-muted", data.missing));
      if (data.stats) {
        body.appendChild(el("h2", "h6", "Statistics"));
        var table = el("table", "table table-sm statistics"), rows = el("tbody");
        table.id = "statistics-table";
        data.stats.forEach(function (stat) {
          var tr = el("tr"), th = el("th", "statistic-name", stat.name), td = el("td", "number", stat.text);
          th.setAttribute("scope", "row");
          th.title = stat.help;
          td.id = "stat-" + stat.name;
          td.setAttribute("data-stat", stat.name);
          td.setAttribute("data-value", stat.value);
          tr.appendChild(th); tr.appendChild(td); rows.appendChild(tr);
        });
        table.appendChild(rows);
        body.appendChild(table);
      }
      if (data.neurons) {
        body.appendChild(el("h2", "h6", "Neurons"));
        body.appendChild(el("p", "text-muted small", data.neurons.caption));
        var list = el("div", "neurons");
        list.id = "neurons";
        data.neurons.items.forEach(function (item, i) {
          var row = el("div", "neuron"), barBox = el("span", "neuron-bar");
          var bar = el("span", "bar " + (item[3] ? "positive" : "negative"));
          bar.style.width = item[2] + "%";
          bar.style.left = item[3] ? "50%" : (50 - item[2]).toFixed(1) + "%";
          barBox.appendChild(bar);
          row.appendChild(el("span", "neuron-index", String(i)));
          row.appendChild(barBox);
          row.appendChild(el("span", "neuron-value number", item[1]));
          row.setAttribute("data-neuron", String(i));
          row.setAttribute("data-value", item[0]);
          list.appendChild(row);
        });
        body.appendChild(list);
      }
    }
    panel.replaceChildren(body);
    return Date.now();
  }

  // -- the clientside callbacks ---------------------------------------------------------------------
  function setSummaries(summaries) {
    state.summaries = summaries || {};
    return window.dash_clientside.no_update;
  }

  function drawBadges(badges) {
    // Findings arrive after the graph: mark the nodes in place rather than rebuild the graph under the user.
    state.badges = badges || {};
    var graph = document.getElementById("dependency-graph");
    if (!graph) return;
    graph.querySelectorAll(".graph-node .node-badge").forEach(function (badge) { badge.remove(); });
    Object.keys(state.drawn).forEach(function (id) {  // a node drawn later gets its badge when it is drawn
      var badge = state.badges[id];
      if (badge) state.drawn[id].appendChild(badgeMark(badge));
    });
  }

  function renderGraph(key, documents, badges, shown) {
    var hash = key && key.hash, doc = hash && documents ? documents[hash] : null;
    var renderKey = (hash || "") + "|" + JSON.stringify(badges || {}), redrawn = false;
    if (renderKey !== state.rendered && doc && doc === state.doc && hash === state.key) {
      drawBadges(badges);
      state.rendered = renderKey;
    } else if (renderKey !== state.rendered || doc !== state.doc) {
      state.doc = doc || null;
      state.badges = badges || {};
      state.rendered = renderKey;
      if (doc) index(doc);
      if (doc && doc.nodes.length > 400 && state.key !== hash) {  // large graphs start with boxes closed
        state.collapsed = {};
        doc.boxes.forEach(function (box) { state.collapsed[box.id] = true; });
      }
      var structureChanged = state.key !== hash;
      state.key = hash;
      render();
      if (structureChanged) fitToPane(document.getElementById("dependency-graph"));
      redrawn = true;
    }
    // Findings' badges or the next step's values of the same node: the view stays where the user scrolled it.
    if (shown && shown.node_id) highlight(shown.node_id, shown.role, redrawn || shown.node_id !== state.selected);
    return renderKey;
  }

  function searchOptions(key, documents, elsewhere) {
    var doc = key && key.hash && documents ? documents[key.hash] : null;
    if (!doc) return [];
    // Then the nodes that exist only in another iteration of this step (server/node_search.py): choosing one opens it.
    return doc.nodes.slice().sort(function (a, b) { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; })
      .map(function (n) {
        return { label: n.name + (n.module_type ? " (" + n.module_type + ")" : "") + (n.old ? " (previous iteration)" : "") + " [" + n.role + "]", value: n.id };
      }).concat(Array.isArray(elsewhere) ? elsewhere : []);
  }

  function notices(data) {
    data = data || {};
    return NOTICE_TOPICS.map(function (topic) { return data[topic] || ""; });
  }

  // -- slider marks that never overlap ---------------------------------------------------------------
  // The server chooses how many marks a slider gets without knowing its width; on a narrow window
  // ("90100110" at 1024 px) the labels that would touch the one before are hidden, the last one kept.
  function thinMarks() {
    var GAP = 6;
    document.querySelectorAll(".dash-slider-root").forEach(function (root) {
      var marks = Array.prototype.slice.call(root.querySelectorAll(".dash-slider-mark"));
      marks.forEach(function (mark) { mark.style.visibility = ""; });
      if (marks.length < 3 || root.getBoundingClientRect().width === 0) return;
      var boxes = marks.map(function (mark) { return mark.getBoundingClientRect(); }), kept = [0];
      for (var i = 1; i < marks.length; i++) {
        if (boxes[i].left >= boxes[kept[kept.length - 1]].right + GAP) kept.push(i);
      }
      var last = marks.length - 1;
      if (kept[kept.length - 1] !== last) {  // the last value is always shown: drop kept ones it would touch
        while (kept.length > 1 && boxes[kept[kept.length - 1]].right + GAP > boxes[last].left) kept.pop();
        kept.push(last);
      }
      marks.forEach(function (mark, index) { if (kept.indexOf(index) < 0) mark.style.visibility = "hidden"; });
    });
  }
  var thinning = false;
  function thinSoon() {
    if (thinning) return;
    thinning = true;
    window.requestAnimationFrame(function () { thinning = false; thinMarks(); });
  }
  window.addEventListener("resize", thinSoon);
  new MutationObserver(thinSoon).observe(document.documentElement, {childList: true, subtree: true,
                                                                    characterData: true, attributes: true,
                                                                    attributeFilter: ["class"]});

  // The distribution plot is read and drawn only while it is in view (issue 34): an IntersectionObserver tells the
  // server callback through the "distribution-shown" store, as the plot scrolls in and out (and as tabs hide it).
  var distribution = { element: null, observer: null, shown: false };
  function watchDistribution() {
    var element = document.getElementById("distribution-plot");
    var dc = window.dash_clientside;
    if (!element || element === distribution.element || !window.IntersectionObserver || !(dc && dc.set_props)) return;
    if (distribution.observer) distribution.observer.disconnect();
    distribution.element = element;
    distribution.observer = new IntersectionObserver(function (entries) {
      var shown = entries[entries.length - 1].isIntersecting;
      if (shown === distribution.shown) return;
      distribution.shown = shown;
      window.dash_clientside.set_props("distribution-shown", { data: shown });
    });
    distribution.observer.observe(element);
  }
  new MutationObserver(watchDistribution).observe(document.documentElement, {childList: true, subtree: true});

  window.dash_clientside = window.dash_clientside || {};
  window.dash_clientside.comgra = { renderGraph: renderGraph, searchOptions: searchOptions, notices: notices,
                                    writeUrl: writeUrl, tabFromUrl: tabFromUrl, clearTabNotice: clearTabNotice,
                                    renderValues: renderValues,
                                    setSummaries: setSummaries };
  // ``reveal(id)``: scroll the graph to a node and draw it, as scrolling by hand does (tests, benchmarks).
  window.comgraGraph = { state: state, neighbour: neighbour, select: select, reveal: keepInView };
})();
