"""fabric_lite's own runtime, under the strategies and launchers and above ``fabric_lite.utilities``:
:mod:`~fabric_lite.runtime.run`, :mod:`~fabric_lite.runtime.rendezvous`, :mod:`~fabric_lite.runtime.supervision`,
:mod:`~fabric_lite.runtime.diagnostics`, :mod:`~fabric_lite.runtime.collectives`, :mod:`~fabric_lite.runtime.checkpoint`
and :mod:`~fabric_lite.runtime.resume`.

Each package is used through its entry module. Imports run from the strategies and launchers down to here, never up.
"""
