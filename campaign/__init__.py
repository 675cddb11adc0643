"""campaign: multi-stage LLM training campaigns on HPC machines, on Parsl, with a ledger."""

__version__ = "0.1.0"
