"""Every `eagle3 <command> --flag` README.md and docs/*.md show is a flag that command has (a renamed flag
otherwise leaves the docs telling users to type an error)."""

from __future__ import annotations

from tests.doc_scan import documented_flags

from eagle3.cli import build_parser
from eagle3.stages import COMMANDS


def _flags_by_command() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(getattr(a, "choices", None), dict))
    return {name: {o for act in p._actions for o in act.option_strings} for name, p in sub.choices.items()}


def test_documented_eagle3_flags_exist():
    flags = _flags_by_command()
    shown = documented_flags(r"eagle3 (" + "|".join(sorted(COMMANDS, key=len, reverse=True)) + r")\b")
    assert len(shown) > 100, "the scan found too few documented flags: has the docs' command style changed?"
    wrong = [f"{doc}:{line}: eagle3 {cmd} {flag}" for doc, line, cmd, flag in shown if flag not in flags[cmd]]
    assert not wrong, "documented flags the command does not have:\n" + "\n".join(wrong)


def test_the_scan_catches_a_wrong_flag(tmp_path, monkeypatch):
    from tests import doc_scan

    doc = tmp_path / "x.md"
    doc.write_text("run `eagle3 train --store S \\\n    --no-such-flag 1` and\n"
                   "eagle3 extract --server-args=--gpu-memory-utilization,0.9 | tail --lines 3\n"
                   "eagle3 extract --merged M \\\n    [--device cpu|cuda] [--summary-json FILE]\n")
    monkeypatch.setattr(doc_scan, "DOCS", [doc])
    monkeypatch.setattr(doc_scan, "ROOT", tmp_path)
    assert documented_flags(r"eagle3 (train|extract)\b") == [
        ("x.md", 1, "train", "--store"), ("x.md", 1, "train", "--no-such-flag"),
        ("x.md", 3, "extract", "--server-args"),
        # a synopsis: bracketed flags count, and a|b is no shell pipe
        ("x.md", 4, "extract", "--merged"), ("x.md", 4, "extract", "--device"),
        ("x.md", 4, "extract", "--summary-json")]
