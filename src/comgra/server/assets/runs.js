// The Runs tab's regex filter (server/runs_view.py), run by AG Grid itself: typing filters the rows the grid
// holds (no new rowData, no request), as GET /api/v1/runs?filter= does on the server: a search in the trial id,
// each hyperparameter value and each name=value (the row's _search texts).
window.comgraRuns = {
    pattern: null,
    compile: function (text) {
        if (!text) { this.pattern = null; return ''; }
        try { this.pattern = new RegExp(text); return ''; } catch (error) {
            this.pattern = null;
            return 'Not a regular expression: ' + error.message;
        }
    },
    present: function () { return this.pattern !== null; },
    passes: function (row) {
        const pattern = this.pattern;
        return !pattern || (row && row._search.some(s => pattern.test(s)));
    },
};
// What the grid's option strings may call (dash-ag-grid evaluates them in this namespace only).
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});
dagfuncs.comgraRunsPresent = function () { return window.comgraRuns.present(); };
dagfuncs.comgraRunsPasses = function (row) { return window.comgraRuns.passes(row); };
