"""Regenerate docs/configuration.md from server.settings: `python docs/gen_configuration.py`."""

from pathlib import Path

from server.settings import markdown_table

HEADER = """# Configuration

Parley reads its settings once, at start, from `PARLEY_*` environment variables
(`python -m server --help` prints the same list), in groups; a bad value, or a bad
combination of values, stops the server at start (exit 2) with one line naming the
variable, its value and what is allowed. Generated from `server/settings/` by
`python docs/gen_configuration.py`; a test keeps the two in step.

"""

if __name__ == "__main__":
    Path(__file__).with_name("configuration.md").write_text(HEADER + markdown_table() + "\n")
