"""The page's component ids (``ID``) and tabs (``TABS``): the contract between the layout, the callbacks,
the keyboard script (assets/comgra.js) and the browser tests. A module of its own, so that the callbacks
and the layout both import it and neither imports the other.
"""
from __future__ import annotations

TABS = ("tensors", "runs", "findings", "health", "samples", "images", "compare", "network", "notes", "graphs", "profile", "resources", "breakpoints", "visualization")


class ID:
    """Component ids shared by layout, callbacks, the keyboard script and the tests."""

    SELECTION = "selection"  # dcc.Store: {"wanted": {...}, "shown": {...}}
    SHOWN = "shown"  # dcc.Store: the shown selection alone, changed only when it changes
    CURRENT_TRIAL = "current-trial"  # dcc.Store: the trial shown, changed only when it changes
    DATA_VERSION = "data-version"
    NODE_CLICK = "node-click"  # set by assets/comgra.js when a node is clicked
    URL = "url"  # dcc.Location: the query string is read at page load (service.URL_KEYS)
    LINK = "view-link"  # dcc.Store: the shown view's link; assets/comgra.js writes it into the URL
    URL_WRITTEN = "url-written"  # dcc.Store: the output of that clientside callback
    GRAPH_KEY = "graph-key"  # dcc.Store: {"trial", "hash"} of the graph shown
    GRAPHS = "graph-documents"  # dcc.Store: hash -> graph document (graph_view.client_graph), sent once each
    GRAPHS_KNOWN = "graph-hashes"  # dcc.Store: the hashes the page holds, so that none is sent twice
    GRAPH_RENDERED = "graph-rendered"  # dcc.Store: the output of the clientside renderer
    BADGES = "graph-badges"  # dcc.Store: node id -> badge text of the current trial (findings)
    STEP_KEY = "step-key"  # dcc.Store: trial, step, iteration, kind and rank shown; changes only with them
    NODE_SUMMARIES = "node-summaries"  # dcc.Store: node id -> min/mean/max at this step, for hover cards
    SUMMARIES_SET = "node-summaries-set"  # dcc.Store: the output of the clientside callback that takes them
    NOTICES = "notices"  # dcc.Store: topic -> text; shown beside the selector it concerns
    VALUES_DATA = "values-data"  # dcc.Store: the values panel as plain data (server/values_view.py)
    VALUES_RENDERED = "values-rendered"  # dcc.Store: the output of the clientside values renderer
    PANELS_BUILT = "panels-built"  # dcc.Store: the tabs whose panels were built (layout.panel_contents)
    POLL = "poll"
    TABS = "tabs"
    BANNER = "banner"
    TAB_NOTICE = "tab-notice"  # says why a link's unknown ?tab= opened the default tab; data-tabs lists the tabs
    TRIAL = "trial-select"
    KIND = "kind-select"
    TYPE = "type-select"
    STEP_SLIDER = "step-slider"
    STEP_INPUT = "step-input"
    STEP_PREV = "step-prev"
    STEP_NEXT = "step-next"
    STEP_INFO = "step-info"
    ITERATION = "iteration-slider"
    AGGREGATION = "aggregation-select"
    ROLE = "role-select"
    RANK = "rank-select"  # a rank of a torch.distributed run, or "all" (one line per rank in the series plot)
    RANK_BOX = "rank-selector"  # shown only when the trial has more than one rank
    SEARCH = "node-search"
    SEARCH_ELSEWHERE = "node-search-elsewhere"  # dcc.Store: search options of nodes only in other iterations
    GRAPH = "dependency-graph"
    NOTICE = "notice"
    VALUES = "values"
    STATISTIC = "statistic-select"
    SERIES = "series-plot"
    HISTOGRAM = "histogram-plot"
    DISTRIBUTION_MODE = "distribution-mode"  # TensorBoard's Distributions (bands) or Histograms (a row per step)
    DISTRIBUTION = "distribution-plot"  # the selected tensor's distribution across steps, trials side by side
    DISTRIBUTION_SHOWN = "distribution-shown"  # dcc.Store: whether the distribution plot is in view (comgra.js)
    PLOTS_LATER = "plots-later"  # dcc.Store: the Tensors tab's plots drawn later, when the tab is shown (tensors.py)
    NETWORK = "network"
    NOTES = "notes"
    KPIS = "kpi-graphs"
    VISUALIZATION = "visualization"

    @staticmethod
    def panel(tab: str) -> str:
        return f"panel-{tab}"

    @staticmethod
    def nav(direction: str) -> str:
        return f"nav-{direction}"

    @staticmethod
    def notice(topic: str) -> str:
        """The slot of the notices about one selector ("general": the page's own slot, ``NOTICE``)."""
        return "notice" if topic == "general" else f"notice-{topic}"
