"""The reference helpdesk: the receiving side of decisionflow's reply delivery.

A separate program with its own SQLite file, started as its own process
(`python -m helpdesk`). It imports nothing of decisionflow and decisionflow imports
nothing of it (an import-linter contract in pyproject.toml says so); the two speak only
the HTTP protocol in helpdesk/README.md.
"""
