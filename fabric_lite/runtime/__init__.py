"""fabric_lite's own runtime, under Lightning's strategies and above Lightning's helper modules
(``fabric_lite.utilities``).

* :mod:`~fabric_lite.runtime.run`: what a run is (:class:`~fabric_lite.runtime.run.RunContext`), made by the launcher
  and handed to the strategy; :mod:`~fabric_lite.runtime.rendezvous` forms its process group.
* :mod:`~fabric_lite.runtime.supervision`: which end of a rank is the root cause of a failed job, under every launcher.
* :mod:`~fabric_lite.runtime.diagnostics`: the trail of collectives and the hang report.
* :mod:`~fabric_lite.runtime.collectives`: the checked collectives on collections behind the strategies' entry points.
* :mod:`~fabric_lite.runtime.checkpoint`: atomic files, sharded folders and asynchronous saves.
* :mod:`~fabric_lite.runtime.resume`: a dataloader that resumes inside an epoch.

Each package is used through its entry module; the names with an underscore are private to it. Nothing here imports
a strategy or a launcher: the imports run from them down to here, and from here down to ``fabric_lite.utilities``.
"""
