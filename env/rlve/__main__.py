"""`python -m env.rlve --list | --check [ENVIRONMENT ...]` (env/rlve/check.py)."""

from .check import main

main()
