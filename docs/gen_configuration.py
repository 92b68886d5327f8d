"""Regenerate docs/configuration.md from server.settings: `python docs/gen_configuration.py`."""

from pathlib import Path

from server.settings import markdown_table

HEADER = """# Configuration

Parley reads its settings once, at start, from `PARLEY_*` environment variables
(`python -m server --help` prints the same list). Generated from `server/settings.py`
by `python docs/gen_configuration.py`; a test keeps the two in step.

"""

if __name__ == "__main__":
    Path(__file__).with_name("configuration.md").write_text(HEADER + markdown_table() + "\n")
