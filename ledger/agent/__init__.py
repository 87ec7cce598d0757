"""The node agent's process side: per-job supervisors, the state file of handles, adoption after
restarts, stops with a grace period, time limits, checkpoints and utilisation samples.

The supervised executor (`ledger.engines.supervised`) is the executor of `gpuledger up`; a networked
node agent runs the same executor behind the server's API. Kept import-light: every job's
supervisor imports `ledger.engines.supervise`, and with it this package.
"""
