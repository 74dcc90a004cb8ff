"""Committed benchmark data (a package so that its .jsonl and .sha256 files ship with installs)."""
