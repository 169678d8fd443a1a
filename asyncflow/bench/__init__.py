"""The benchmarks of ``afctl bench`` (``cli/bench.py`` names them, one module each):
figures measured side by side in one invocation, printed, the last line one JSON object
with ``--json``. Helpers: ``_shared_inputs`` (options and inputs several benches share),
``_breakdown`` (a trace's stage times), ``_op_profile`` (operator self times),
``_peer_trl`` (TRL's GRPOTrainer in a process of its own, for ``bench peer``)."""
