// The Runs tab's regex filter (server/runs_view.py), run in the browser without a round trip through Dash's
// callbacks: typing into #runs-filter compiles the pattern, lets AG Grid filter the rows it holds and writes the
// count, all in the input event (no new rowData, no request). It searches as GET /api/v1/runs?filter= does on the
// server: the trial id, each hyperparameter value and each name=value (the row's _search texts). The set of trials
// shown goes to the runs-shown store (which the plots below the table follow) once typing pauses, and only when
// the set changed: a sort changes no set and draws no plot again.
window.comgraRuns = {
    pattern: null,
    rows: [],
    shown: null,  // the trial ids last sent to runs-shown, joined
    timer: null,
    SHOWN_AFTER_MS: 400,
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
    passing: function () { return this.rows.filter(row => this.passes(row)).map(row => row.trial); },
    count: function (passing) {
        return this.pattern ? passing.length + ' of ' + this.rows.length + ' trials' : this.rows.length + ' trials';
    },
    grid: function () {
        try { return dash_ag_grid.getApi('runs-grid'); } catch (error) { return null; }
    },
    // The trials shown now, for the plots: returned when it differs from what was sent last, else null.
    changedShown: function (passing) {
        const key = passing.join('\u0000');
        if (key === this.shown) { return null; }
        this.shown = key;
        return passing;
    },
    typed: function (text) {
        const notice = this.compile(text);
        const passing = this.passing();
        const api = this.grid();
        if (api) { api.onFilterChanged(); }
        const count = document.getElementById('runs-count');
        if (count) { count.textContent = this.count(passing); }
        const shownNotice = document.getElementById('runs-filter-notice');
        if (shownNotice) { shownNotice.textContent = notice; }
        clearTimeout(this.timer);
        this.timer = setTimeout(() => {
            const changed = this.changedShown(this.passing());
            if (changed !== null && window.dash_clientside && window.dash_clientside.set_props) {
                window.dash_clientside.set_props('runs-shown', {data: changed});
            }
        }, this.SHOWN_AFTER_MS);
    },
};
document.addEventListener('input', function (event) {
    if (event.target && event.target.id === 'runs-filter') { window.comgraRuns.typed(event.target.value); }
}, true);
// What the grid's option strings may call (dash-ag-grid evaluates them in this namespace only).
var dagfuncs = (window.dashAgGridFunctions = window.dashAgGridFunctions || {});
dagfuncs.comgraRunsPresent = function () { return window.comgraRuns.present(); };
dagfuncs.comgraRunsPasses = function (row) { return window.comgraRuns.passes(row); };
