"""`postrl --help` tells a user what postrl does and how to start, in whole sentences."""

from __future__ import annotations

import pytest

from postrl.cli import build_parser, main


def test_help_says_what_postrl_does_and_how_to_start(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert out.startswith("usage: postrl ")
    description = build_parser().description
    assert description.rstrip().endswith(".")  # not cut mid-sentence, as a docstring's first line was
    assert description in out  # printed whole: RawDescriptionHelpFormatter keeps its lines
    for command in ("postrl train default", "postrl eval RUN_DIR/final", "postrl rollouts RUN_DIR",
                    "postrl plan default"):
        assert command in out
    assert "add_parser" not in out and "commands/<name>.py" not in out  # developer notes stay in the source
