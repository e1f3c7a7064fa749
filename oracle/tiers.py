"""The parity matrix's tiers, by size (oracle.cases.parity_cases builds them): importable without
torch, for the pytest plugin's and the CLI's option parsing."""

TIERS = ("cpu", "quick", "full")
