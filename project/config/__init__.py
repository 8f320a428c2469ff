"""The schema of a run (``RunConfig``), its checks, and every script's command line. Imports nothing heavy."""
