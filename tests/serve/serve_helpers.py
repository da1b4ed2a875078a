"""Shared by this folder's tests (importable by name: pytest puts the folder on sys.path)."""

TOKEN = "sekrit"  # the bearer token the shared servers want
AUTH = {"Authorization": f"Bearer {TOKEN}"}
