"""A job's command in `jobs`: one row, readable (issue 33: a multi-line command broke its row, with '"'"')."""

import pytest

from clustertool.cli.render import command_line

pytestmark = pytest.mark.unit


def test_a_multi_line_command_stays_one_line_with_readable_quotes():
    shown = command_line(["python", "-c", "import os\nprint('it')"])
    assert shown == "python -c \"import os⏎print('it')\"" and "\n" not in shown


def test_plain_words_stay_bare_and_a_launchers_options_are_all_there():
    assert command_line(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1"]) == \
        "torchrun --nproc-per-node 2 train.py --lr 0.1"
    assert command_line(["echo", "a b", "$HOME"]) == "echo 'a b' '$HOME'"
