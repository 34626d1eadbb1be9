import pytest

from clustertool.core.words import counted

pytestmark = pytest.mark.unit


def test_one_is_singular_and_every_other_count_plural():
    assert counted(1, "entry", "entries") == "1 entry"
    assert [counted(n, "file") for n in (0, 2)] == ["0 files", "2 files"]
    assert counted(1, "pass", "passes") == "1 pass" and counted(3, "pass", "passes") == "3 passes"
