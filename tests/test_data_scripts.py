"""The data-making scripts (scripts/make_code_problems.py, make_word_problems.py) and their shared
tail (scripts/_data_files.py): the shipped files under recipes/data are what the scripts write,
byte for byte, and a file is written whole."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import _data_files  # noqa: E402


@pytest.mark.parametrize("command, files", [
    (["make_code_problems.py"], ["code_test.jsonl", "code_train.jsonl"]),
    (["make_word_problems.py", "--numbers", "1-10", "--train", "1500"],
     ["word_problems_1to10_train.jsonl", "word_problems_1to10_test.jsonl"]),
])
def test_the_shipped_data_files_are_what_the_scripts_write(tmp_path, command, files):
    out = tmp_path / "data"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / command[0]), *command[1:], "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(files)
    for name in files:
        assert (out / name).read_bytes() == (ROOT / "recipes" / "data" / name).read_bytes(), name
        assert f"{out / name}: " in done.stdout


def test_write_jsonl_writes_utf8_lines_whole_and_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "new" / "rows.jsonl"
    _data_files.write_jsonl(path, [{"question": "Zoë has 3 apples", "answer": "#### 3"}, {"n": 1}])
    assert path.read_bytes() == '{"question": "Zoë has 3 apples", "answer": "#### 3"}\n{"n": 1}\n'.encode()
    assert capsys.readouterr().out == f"{path}: 2 problems\n"
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()][1] == {"n": 1}

    def power_cut(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", power_cut)
    with pytest.raises(OSError, match="disk gone"):
        _data_files.write_jsonl(path, [{"n": 2}])
    assert path.read_text(encoding="utf-8").endswith('{"n": 1}\n') and os.listdir(path.parent) == ["rows.jsonl"]
