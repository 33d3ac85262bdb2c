"""Every option of the three stage CLIs states its default in `--help` (python -m training, export, serving).

Each option's help is read as `--help` prints it (the shared formatter, `ctr_contract/cli_help.py`, appends
`(default: X)` where the text does not say it). A switch or an option whose default is None must say in
words what happens without it ("default: off", "default: all rows"); a plain value must appear in its help.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from export.__main__ import build_parser as export_parser
from serving.app.config import build_parser as serving_parser
from training.cli import build_parser as training_parser

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "training": training_parser,
    "export": export_parser,
    "serving": serving_parser,
}


def shown_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The option's help text with the formatter's additions and `%(default)s` expanded, on one line."""
    formatter = parser._get_formatter()
    text = formatter._expand_help(action) if action.help is not None else ""
    return " ".join(text.split())


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def default_texts(default: object) -> set[str]:
    """Ways a default may be written: as argparse prints it, and a float in its short form."""
    texts = {str(default)}
    if isinstance(default, float):
        texts.add(f"{default:g}")
    return texts


@pytest.mark.parametrize("cli", sorted(PARSERS))
def test_every_option_states_its_default(cli: str) -> None:
    parser = PARSERS[cli]()
    missing = [a.option_strings[0] for a in options(parser) if "default" not in shown_help(parser, a).lower()]
    assert missing == [], f"python -m {cli}: options whose --help states no default: {missing}"


@pytest.mark.parametrize("cli", sorted(PARSERS))
def test_a_plain_default_value_is_the_one_shown(cli: str) -> None:
    parser = PARSERS[cli]()
    wrong = [
        (a.option_strings[0], a.default)
        for a in options(parser)
        if isinstance(a.default, int | float | str)
        and not isinstance(a.default, bool)
        and not any(t in shown_help(parser, a) for t in default_texts(a.default))
    ]
    assert wrong == [], f"python -m {cli}: help that does not show the option's default value: {wrong}"


@pytest.mark.parametrize("cli", sorted(PARSERS))
def test_every_option_has_help_text_of_its_own(cli: str) -> None:
    parser = PARSERS[cli]()
    bare = [a.option_strings[0] for a in options(parser) if not (a.help or "").strip()]
    assert bare == [], f"python -m {cli}: options without help text: {bare}"


def test_the_check_catches_an_option_without_a_stated_default() -> None:
    from ctr_contract.cli_help import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="stop after N rows")
    parser.add_argument("--quiet", action="store_true", help="print less")
    parser.add_argument("--rows", type=int, default=7, help="rows to read")
    said = {a.option_strings[0]: "default" in shown_help(parser, a) for a in options(parser)}
    assert said == {"--limit": False, "--quiet": False, "--rows": True}
