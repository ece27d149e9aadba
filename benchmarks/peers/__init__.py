"""The peers of benchmarks/vs_peers.py: where each one's venv comes from, how it is launched, how it is measured."""
