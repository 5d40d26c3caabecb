"""The findings questions of the service (issue 8): findings per trial, badges for the graph, links.

Mixed into ``RecordingService``. A scan reads each chunk once and keeps what it found until a
trial's chunks change, so the Findings tab and the graph badges of a live run stay current
without rereading the recording.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from comgra.analysis.findings import Finding, ScanOptions, rank_findings
from comgra.errors import StoreError

if TYPE_CHECKING:
    from comgra.analysis.scan import Scanner
    from comgra.store.reader import GroupReader

BADGE_SEVERITIES = ("error", "warning")
BADGE_MARK = "\u26a0"  # ⚠
BADGE_WAIT_SECONDS = 0.25  # the first view of a trial waits at most this long for its badges


def finding_link(finding: Finding) -> str:
    """The app's link that opens the selection showing a finding (built with ``service.view_link``)."""
    from comgra.service import view_link

    return view_link(finding.trial, training_step=finding.training_step, iteration=finding.iteration,
                     node_id=finding.node, role=finding.role, kind=finding.kind, aggregation=finding.aggregation)


class FindingQuestions:
    """Findings of the recording the service reads (``self.group``)."""

    group: GroupReader
    _scanner_lock = threading.Lock()

    def _scanner(self) -> Scanner:
        with self._scanner_lock:
            scanner = self.__dict__.get("_findings_scanner")
            if scanner is None:
                from comgra.analysis.scan import Scanner  # pandas, scipy: seconds to import, not at app start

                scanner = self.__dict__["_findings_scanner"] = Scanner()
            return scanner

    def findings(self, trial_id: str | None = None, options: ScanOptions | None = None) -> list[Finding]:
        """Findings of one trial or of all, most useful first; trials that cannot be read are skipped."""
        trials = [trial_id] if trial_id is not None else self.group.trials()
        found: list[Finding] = []
        for trial in trials:
            try:
                found.extend(self._scanner().scan_trial(self.group, trial, options or ScanOptions())[0])
            except StoreError:
                continue
        return rank_findings(found)

    def finding_badges(self, trial_id: str, wait_seconds: float = BADGE_WAIT_SECONDS) -> dict[str, str]:
        """node id -> a short badge ("2 ⚠") for the nodes of a trial with findings of warning or above.

        The graph must not wait for a long scan: the trial is scanned on a background thread, and
        if that takes longer than ``wait_seconds`` there are no badges yet (the next view has them).
        The thread goes on with the other trials, so that the Findings tab opens on a finished scan.
        """
        done = threading.Event()
        found: list[Finding] = []

        def scan() -> None:
            try:
                # Every trial, this one first: a user who opens the Findings tab next finds them scanned.
                found.extend(self.findings(trial_id))
                done.set()
                for other in self.group.trials():
                    if not threading.main_thread().is_alive():
                        break  # the app is stopping: it waits for this thread, so no more trials
                    self.findings(other)
            finally:
                done.set()

        # Not a daemon: a daemon thread inside DuckDB when the interpreter ends aborts the process
        # ("terminate called ..."); this one ends after the trial it is scanning once the app stops.
        threading.Thread(target=scan, name=f"comgra-findings-{trial_id}").start()
        if not done.wait(wait_seconds):
            return {}
        counts: dict[str, int] = {}
        for finding in found:
            if finding.severity in BADGE_SEVERITIES:
                counts[finding.node] = counts.get(finding.node, 0) + 1
        return {node: f"{count} {BADGE_MARK}" for node, count in counts.items()}

    def finding_documents(self, trial_id: str | None = None) -> list[dict[str, Any]]:
        """The findings as JSON documents (the ``comgra scan --json`` form), each with its link."""
        return [f.to_json(finding_link(f)) for f in self.findings(trial_id)]
