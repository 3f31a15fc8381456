"""The README's walkthrough block parses into the commands tests/gpu/test_readme.py runs."""

from __future__ import annotations

from readme_walkthrough import python_example, walkthrough_steps

SAMPLE = """# x

## Walkthrough

```sh
make -C examples/vecadd          # a comment
DB=$(ls recordings/vecadd/*.json)

mneme tune -rdb $DB --sampler exhaustive \\
  --results-dir results/vecadd   # continued
mneme run --apply results/vecadd
```

Run `python examples/tuning_vecadd_exhaustive.py --record-db $DB`.

## Next
```sh
not this
```
"""


def test_the_readme_walkthrough_has_the_steps_the_gpu_test_checks():
    steps = walkthrough_steps()
    firsts = [" ".join(s.words[:2]) for s in steps if not s.variable]
    assert {"mneme record", "mneme ls", "mneme replay", "mneme tune"} <= set(firsts)
    assert [s.variable for s in steps if s.variable] == ["DB"]
    tune = next(s for s in steps if s.words[:2] == ["mneme", "tune"] and s.words[2] != "report")
    assert "--results-dir" in tune.words and "--record-id" not in tune.words and "-rid" not in tune.words
    assert python_example().startswith("python examples/") and "$DB" in python_example()


def test_continuations_comments_assignments_and_later_steps():
    steps = walkthrough_steps(SAMPLE)
    assert [(s.variable, s.words) for s in steps] == [
        ("", ["make", "-C", "examples/vecadd"]),
        ("DB", ["ls", "recordings/vecadd/*.json"]),
        ("", ["mneme", "tune", "-rdb", "$DB", "--sampler", "exhaustive", "--results-dir", "results/vecadd"]),
        ("", ["mneme", "run", "--apply", "results/vecadd"]),
    ]
    assert python_example(SAMPLE) == "python examples/tuning_vecadd_exhaustive.py --record-db $DB"


def test_the_walkthroughs_mneme_commands_parse_as_they_are_written():
    from mneme.cli import build_parser, parse

    parsed = []
    for step in walkthrough_steps():
        if step.words[:1] == ["mneme"]:
            words = [w.replace("$DB", "recordings/vecadd/1.json") for w in step.words[1:]]
            parsed.append(parse(build_parser(words[0]), words))  # an argparse error exits the test
    report = next(a for a in parsed if getattr(a, "tune_command", None) == "report")
    assert report.directories == ["results/vecadd"]
    assert any(a.command == "tune" and a.tune_command is None and a.record_database for a in parsed)
