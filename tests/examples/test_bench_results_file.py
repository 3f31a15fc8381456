"""bench/results_file.py: one section per benchmark mode, with where, when and on what it was measured."""

from __future__ import annotations

import results_file  # bench/results_file.py (pytest puts bench/ on the path)


def test_a_run_replaces_its_own_section_and_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_BENCH_RESULTS", str(tmp_path))
    monkeypatch.setenv("MNEME_COMMIT", "abc1234")
    path = results_file.write_result("demo", "mode a", "| x |\n| --- |\n| 1 |", command=["bench/demo.py", "--a"])
    results_file.write_result("demo", "mode b", "| y |\n| --- |\n| 2 |")
    results_file.write_result("demo", "mode a", "| x |\n| --- |\n| 3 |")
    text = path.read_text()
    assert path == tmp_path / "demo.md" and text.startswith("# bench/demo.py\n")
    assert text.count("## mode a") == 1 and "| 3 |" in text and "| 1 |" not in text and "| 2 |" in text
    assert "* commit: abc1234" in text and "* date: " in text and "* GPU: " in text and "CPUs" in text


def test_appended_runs_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("MNEME_BENCH_RESULTS", str(tmp_path))
    for value in (1, 2):
        results_file.write_result("history", "run", f"value {value}", append=True)
    text = (tmp_path / "history.md").read_text()
    assert text.count("## run") == 2 and "value 1" in text and "value 2" in text


def test_record_output_writes_what_the_bench_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MNEME_BENCH_RESULTS", str(tmp_path))

    def main():
        print("[demo 12:00:00] building")  # progress: printed, not recorded
        print("| a | b |\n| --- | --- |\n| 1 | 2 |")
        return 0

    assert results_file.record_output("printed", main, title="t") == 0
    text = (tmp_path / "printed.md").read_text()
    assert "| 1 | 2 |" in text and "building" not in text
    assert "| 1 | 2 |" in capsys.readouterr().out
    assert results_file.record_output("failed", lambda: 3) == 3
    assert not (tmp_path / "failed.md").exists()


def test_plain_text_goes_into_a_text_block_and_off_writes_nothing(tmp_path, monkeypatch):
    assert results_file.as_markdown("a    b\n1    2\n").startswith("```text\n")
    monkeypatch.setenv("MNEME_BENCH_RESULTS", "off")
    assert results_file.write_result("none", "t", "x") is None
