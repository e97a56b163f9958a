"""fabric_lite's own runtime: what a run is (:mod:`~fabric_lite.runtime.run`) and how a failed or hung run is
explained (:mod:`~fabric_lite.runtime.diagnostics`).

Launchers make a :class:`~fabric_lite.runtime.run.RunContext` and hand it to the strategy; the strategy keeps the
process group and the collectives, and leaves the trail of collectives and the hang report to
:class:`~fabric_lite.runtime.diagnostics.RankDiagnostics`. Nothing here imports a strategy or a launcher: the imports
run from them down to here, and from here down to ``fabric_lite.utilities``.
"""
