"""`--help` that shows every default: argparse's ArgumentDefaultsHelpFormatter, minus repeats.

Shared by the `python -m training`, `export` and `serving` command lines, so all three print defaults the
same way. Help that already names its default (by hand, or through `%(default)s`) is left as written.
"""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ` (default: X)` to each option's help unless it already says its default or has none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        # nargs == 0: a store_true/store_false switch, whose default is just "not given".
        if (
            "default" in help_text
            or action.default is None
            or action.default is argparse.SUPPRESS
            or action.nargs == 0
        ):
            return action.help
        return super()._get_help_string(action)


class RawDescriptionDefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """DefaultsHelpFormatter that keeps the description's and epilog's own line breaks."""
