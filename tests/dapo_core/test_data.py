"""Data loaders: named sets and their row counts, de-duplication, verl's parquet layout, user
files, malformed rows, and the prompt templates."""

from __future__ import annotations

import fnmatch
import gzip
import json
import logging
import tomllib
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_core.algo.rewards import math_score
from dapo_core.data import arithmetic, explore, lookup, synthetic
from dapo_core.data.loaders import (
    DAPO_PREFIX,
    DAPO_SUFFIX,
    KNOWN,
    MAX_ANSWER_CHARS,
    MAX_PROMPT_CHARS,
    MAX_ROW_BYTES,
    NAMED,
    Problem,
    deduplicate,
    format_prompt,
    is_float_artefact,
    load_problems,
    load_problems_with_report,
)
from dapo_core.models import build_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
VERL = SHARED / "verl_format"

# Rows after de-duplication (only DAPO-Math-17k loses any: see test_dapo_math_dedup_report).
EXPECTED_ROWS = {
    "synthetic": synthetic.TRAIN_SIZE,
    "synthetic-eval": synthetic.EVAL_SIZE,
    "arithmetic": arithmetic.TRAIN_SIZE,
    "arithmetic-eval": arithmetic.EVAL_SIZE,
    "explore": explore.TRAIN_SIZE,
    "explore-eval": explore.EVAL_SIZE,
    "lookup": lookup.NUM_KEYS,
    "lookup-eval": lookup.NUM_KEYS,
    "lookup-coin": lookup.NUM_KEYS * lookup.COIN_REPEATS,
    "dapo-math-17k": 17_276,
    "aime2024": 30,
    "aime2025": 30,
    "gsm8k": 7_473,
    "gsm8k-test": 1_319,
    "math500": 500,
}


# --- named sets ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", KNOWN)
def test_every_named_set_loads_with_its_row_count(name: str) -> None:
    problems = load_problems(name)
    assert len(problems) == EXPECTED_ROWS[name]
    assert all(isinstance(p, Problem) for p in problems)
    assert all(p.prompt.strip() and p.answer.strip() for p in problems)
    assert {p.source for p in problems} == {name}
    # idx is the row in the source: unique, and increasing in file order.
    idx = [p.idx for p in problems]
    assert idx == sorted(set(idx))


def test_names_are_case_and_underscore_tolerant() -> None:
    assert len(load_problems("AIME2024")) == 30
    assert len(load_problems("gsm8k_test")) == 1_319


def test_shipped_answers_match_the_shared_copies() -> None:
    for name, spec in NAMED.items():
        if not spec.shipped or name == "dapo-math-17k":
            continue
        rows = [json.loads(line) for line in (SHARED / spec.file).read_text().splitlines()]
        problems = load_problems(name)
        assert [p.answer for p in problems] == [str(r["answer"]) for r in rows]
        assert [p.prompt for p in problems] == [r["problem"] for r in rows]


def test_shipped_files_are_package_data_with_sources() -> None:
    """Each shipped file is under dapo_core/data/datasets, named in its SOURCES.md, and matched by
    a package-data glob of pyproject.toml (so a wheel carries it)."""
    folder = resources.files("dapo_core.data.datasets")
    sources = folder.joinpath("SOURCES.md").read_text()
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    patterns = [g for key in ("*", "dapo_core.data.datasets") for g in globs.get(key, [])]
    for spec in NAMED.values():
        if not spec.shipped:
            continue
        assert folder.joinpath(spec.file).is_file()
        assert spec.file in sources
        assert any(fnmatch.fnmatch(spec.file, g) for g in patterns), spec.file
    assert "license" in sources.lower() and "Apache-2.0" in sources and "MIT" in sources


def test_gsm8k_train_needs_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DAPO_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match="DAPO_DATA_DIR"):
        load_problems("gsm8k")
    monkeypatch.setenv("DAPO_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"gsm8k_train\.jsonl does not exist"):
        load_problems("gsm8k")


def test_unknown_name_and_missing_file_say_what_is_known() -> None:
    with pytest.raises(ValueError, match="unknown data set 'aime2023'") as err:
        load_problems("aime2023")
    assert all(name in str(err.value) for name in KNOWN)
    assert "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="does not exist") as missing:
        load_problems("/no/such/problems.jsonl")
    assert "synthetic" in str(missing.value)


def test_unsupported_file_type_and_directory(tmp_path: Path) -> None:
    csv = tmp_path / "problems.csv"
    csv.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(ValueError, match="unsupported format"):
        load_problems(str(csv))
    with pytest.raises(ValueError, match="not a file"):
        load_problems(str(tmp_path))


# --- the synthetic task ----------------------------------------------------------------------
def test_synthetic_answers_are_the_sums_and_held_out_is_disjoint() -> None:
    eval_set = load_problems("synthetic-eval")
    assert len({p.prompt for p in eval_set}) == len(eval_set)  # distinct problems
    for seed in (0, 1, 7):
        train = load_problems("synthetic", seed=seed)
        assert not {p.prompt for p in train} & {p.prompt for p in eval_set}
    for p in eval_set[:50] + load_problems("synthetic")[:50]:
        terms = [int(t) for t in p.prompt.removesuffix("=?\n").split("+")]
        assert p.answer == str(sum(terms))


def test_synthetic_is_deterministic_and_seeded() -> None:
    assert load_problems("synthetic", seed=3) == load_problems("synthetic", seed=3)
    assert load_problems("synthetic", seed=3) != load_problems("synthetic", seed=4)
    # The held-out set is the same whatever the seed, so every run is scored on one set.
    assert load_problems("synthetic-eval", seed=0) == load_problems("synthetic-eval", seed=5)


def test_synthetic_difficulty_and_length_spread() -> None:
    """Every number of terms appears. A k-term solution takes 8 tokens for its first line, 8 per
    long line and 6 per short one, and 5 for `Answer: NN` + EOS: all long 8k − 3, all short
    6k + 1, at most 37 for five terms: one below where the tiny preset's soft punishment starts
    (L_max − L_cache = 44 − 6 = 38), so a solution written without a loop is never penalised."""
    from dapo_core.setup.presets import preset_config

    tok = build_tiny_tokenizer()
    tasks = synthetic.train_tasks(2_000, seed=0)
    counts = {k: sum(len(t.terms) == k for t in tasks) for k in range(2, 6)}
    assert all(400 <= c <= 600 for c in counts.values()), counts  # uniform: 500 each
    tiny = preset_config("tiny")
    zone = tiny.rollout.max_response_len - tiny.algo.overlong_cache_len
    assert zone == 38

    def n_tokens(text: str) -> int:
        return len(tok(text)["input_ids"]) + 1  # + EOS

    for task in tasks[:200]:
        k = len(task.terms)
        assert n_tokens(task.solution(long_lines=True)) == 8 * k - 3 <= 37 < zone
        assert n_tokens(task.solution(long_lines=False)) == 6 * k + 1
        # Both worked solutions are judged correct by the project's reward.
        assert math_score(task.solution(True), str(task.answer)).acc == 1.0
        assert math_score(task.solution(False), str(task.answer)).acc == 1.0
    assert (
        synthetic.SumTask((37, 4, 9, 1)).solution(True) == "37+4=41\n41+9=50\n50+1=51\nAnswer: 51"
    )
    assert synthetic.SumTask((37, 4, 9, 1)).solution(False) == "37+4=41\n+9=50\n+1=51\nAnswer: 51"


def test_synthetic_demonstrations_slip_only_on_carries_and_sometimes_loop() -> None:
    """A slip forgets a carry (−10) and the wrong total is carried to the answer; a step without
    a carry cannot slip. A loop writes every line from one on twice: the answer stays right and
    the length grows by the looped lines (task.length)."""
    tok = build_tiny_tokenizer()
    task = synthetic.SumTask((37, 4, 9, 1))  # 37+4 carries, 41+9 carries, 50+1 does not
    assert task.carries == 2
    assert task.write([True, True], [True, False, False]).endswith("Answer: 41")  # 31+9+1
    assert task.write([True, True], [False, False, True]) == task.solution(True)  # no carry
    looped = task.write([False, True], [False] * 3, loop_from=1)
    assert looped == "37+4=41\n+9=50\n+9=50\n50+1=51\n50+1=51\nAnswer: 51"
    # 8 + 6 + 8 + 5 = 27 without the loop; the loop repeats lines 1 and 2: + 6 + 8 = 41
    assert len(tok(looped)["input_ids"]) + 1 == task.length([False, True], 1) == 41
    assert math_score(looped, "51").acc == 1.0
    lengths, wrong, loops = set(), 0, 0
    for prompt, demo in synthetic.demonstrations(1_000, seed=0):
        terms = [int(t) for t in prompt.removesuffix("=?\n").split("+")]
        loops += len(demo.splitlines()) - 1 > len(terms) - 1
        lengths.add(len(tok(demo)["input_ids"]))
        wrong += math_score(demo, str(sum(terms))).acc == 0.0
    assert len(lengths) >= 15  # lengths spread
    assert 0.1 < wrong / 1_000 < 0.5  # some demonstrations slip, most do not
    assert 0.2 < loops / 1_000 < 0.4  # RAMBLE_RATE 0.3


# --- DAPO-Math-17k de-duplication ------------------------------------------------------------
def test_dapo_math_dedup_report(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dapo_core.data.loaders"):
        problems, report = load_problems_with_report("dapo-math-17k")
    assert report is not None
    assert report.rows == 17_917
    assert report.exact_duplicates == 616
    assert len(report.conflicting) == 11 and report.conflicting_rows == 22
    assert sorted(a for _, a in report.float_artefacts) == [
        "105263157894736848",
        "105263157894736848",
        "22099999999999998951424",
    ]
    # 17,917 − 616 − 22 − 3 = 17,276
    assert report.kept == len(problems) == 17_276
    assert len({p.prompt for p in problems}) == len(problems)
    conflicted = {text for text, _, _ in report.conflicting}
    assert not conflicted & {p.prompt for p in problems}
    # The log says it in words and names the conflicting problems.
    text = caplog.text
    assert "kept 17,276 of 17,917" in text and "616 exact duplicate rows" in text
    assert "22 rows of 11 problems with conflicting answers" in text
    assert "Determine the greatest power of $2$" in text and "6 vs 64" in text
    assert "22099999999999998951424" in text and "float artefact" in text


def test_float_artefact_rule() -> None:
    assert is_float_artefact("22099999999999998951424")  # int(float(2.21e22))
    assert is_float_artefact("105263157894736848")  # int(float(105263157894736842))
    assert not is_float_artefact("105263157894736842")  # the true answer: not a double
    assert not is_float_artefact("20000000000000000000000")  # a double, but prints the same
    assert not is_float_artefact(str(2**70))  # a power of two is a plausible answer
    assert not is_float_artefact("123")
    assert not is_float_artefact("1.5e22")


def test_deduplicate_by_hand() -> None:
    def p(text: str, answer: str, idx: int) -> Problem:
        return Problem(prompt=text, answer=answer, source="t", idx=idx)

    rows = [
        p("a", "1", 0),
        p("b", "2", 1),
        p("a", "1", 2),  # exact duplicate of row 0
        p("c", "3", 3),
        p("c", "4", 4),  # conflicts with row 3: both go
        p("d", "22099999999999998951424", 5),  # float artefact
        p("a", "1", 6),  # second duplicate of row 0
    ]
    kept, report = deduplicate(rows, "t")
    assert [q.idx for q in kept] == [0, 1]
    assert (report.rows, report.kept, report.exact_duplicates) == (7, 2, 2)
    assert report.conflicting == [("c", ["3", "4"], [3, 4])]
    assert report.float_artefacts == [(5, "22099999999999998951424")]
    assert "rows 4/5 'c' answers 3 vs 4" in report.describe()


# --- verl's parquet layout ----------------------------------------------------------------------
def test_verl_aime_parquet_is_the_thirty_problems(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dapo_core.data.loaders"):
        problems, report = load_problems_with_report(str(VERL / "aime-2024.parquet"))
    assert report is not None and report.rows == 960 and report.exact_duplicates == 930
    assert len(problems) == 30
    assert "dropped 930 exact duplicate rows" in caplog.text
    # The raw problem (extra_info.raw_problem), not the templated prompt.
    assert not any(p.prompt.startswith("Solve the following") for p in problems)
    shipped = load_problems("aime2024")
    assert sorted(p.answer for p in problems) == sorted(p.answer for p in shipped)


def test_verl_dapo_sample_strips_the_instruction() -> None:
    problems = load_problems(str(VERL / "dapo-math-17k.sample16.parquet"))
    assert len(problems) == 16
    assert problems[0].prompt.startswith("In triangle $ABC$")
    assert problems[0].answer == "34"
    assert not any("Solve the following" in p.prompt for p in problems)


def _write_parquet(path: Path, rows: list[dict[str, object]]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_layout_without_raw_problem(tmp_path: Path) -> None:
    path = tmp_path / "mine.parquet"
    _write_parquet(
        path,
        [
            {
                "prompt": [{"role": "user", "content": DAPO_PREFIX + "What is 6*7?" + DAPO_SUFFIX}],
                "reward_model": {"ground_truth": "42", "style": "rule"},
                "extra_info": {"index": "uuid-1"},
            },
            {
                "prompt": [{"role": "user", "content": "Plain 1+1?"}],
                "reward_model": {"ground_truth": "2", "style": "rule"},
                "extra_info": {"index": "uuid-2"},
            },
        ],
    )
    problems = load_problems(str(path))
    assert [(p.prompt, p.answer, p.idx) for p in problems] == [
        ("What is 6*7?", "42", 0),
        ("Plain 1+1?", "2", 1),
    ]


def test_parquet_bad_rows_name_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    _write_parquet(
        path,
        [
            {"prompt": [{"role": "user", "content": "q1"}], "reward_model": {"ground_truth": "1"}},
            {"prompt": [{"role": "user", "content": "q2"}], "reward_model": None},
        ],
    )
    with pytest.raises(
        ValueError, match=r"bad\.parquet row 2: missing 'reward_model\.ground_truth'"
    ):
        load_problems(str(path))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        load_problems(str(junk))


# --- user files ----------------------------------------------------------------------------------
def test_user_jsonl_flat_layouts(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"problem": "What is 2+2?", "answer": "4"},
        {"prompt": "What is 3*3?", "answer": 9},  # `prompt` text and an integer answer
        {"problem": "Half of 3?", "answer": 1.5, "extra": "ignored"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a blank line is no row
    problems = load_problems(str(path))
    assert [(p.prompt, p.answer, p.idx, p.source) for p in problems] == [
        ("What is 2+2?", "4", 0, str(path)),
        ("What is 3*3?", "9", 1, str(path)),
        ("Half of 3?", "1.5", 2, str(path)),
    ]
    gz = tmp_path / "mine.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(json.dumps(r) for r in rows))
    assert [p.answer for p in load_problems(str(gz))] == ["4", "9", "1.5"]


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"problem": "x"}', "missing 'answer'"),
        ('{"answer": "1"}', "missing 'problem' (or 'prompt')"),
        ('{"problem": "x", "answer": "1"', "not valid JSON"),
        ('["problem", "answer"]', "expected a JSON object"),
        ('{"problem": "   ", "answer": "1"}', "the problem text is empty"),
        ('{"problem": "x", "answer": ""}', "'answer' is empty"),
        ('{"problem": "x", "answer": null}', "'answer' must be text or a number"),
        ('{"problem": 5, "answer": "1"}', "'problem' must be text"),
    ],
)
def test_malformed_row_names_file_and_row(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "data.jsonl"
    good = json.dumps({"problem": "1+1?", "answer": "2"})
    path.write_text(f"{good}\n{good}\n{bad_line}\n{good}\n")
    with pytest.raises(ValueError) as err:
        load_problems(str(path))
    assert str(err.value).startswith(f"{path} row 3: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"problem": "x" * (MAX_PROMPT_CHARS + 1), "answer": "1"},
            f"the problem has {MAX_PROMPT_CHARS + 1:,} characters, more than the limit of "
            f"{MAX_PROMPT_CHARS:,}",
        ),
        (
            {"problem": "1+1?", "answer": "2" * (MAX_ANSWER_CHARS + 1)},
            f"'answer' has {MAX_ANSWER_CHARS + 1:,} characters, more than the limit of "
            f"{MAX_ANSWER_CHARS:,}",
        ),
        # A 1M-newline answer strips to one character: whitespace around it is not counted.
        ({"problem": "1+1?", "answer": "\n" * 1_000_000 + "2"}, None),
    ],
)
def test_over_long_fields_name_file_and_row(
    tmp_path: Path, row: dict[str, str], message: str | None
) -> None:
    path = tmp_path / "big.jsonl"
    good = json.dumps({"problem": "2+2?", "answer": "4"})
    path.write_text(f"{good}\n{json.dumps(row)}\n")
    if message is None:
        assert [p.answer for p in load_problems(str(path))] == ["4", "2"]
        return
    with pytest.raises(ValueError) as err:
        load_problems(str(path))
    assert str(err.value) == f"{path} row 2: {message}"


def test_fields_at_the_limits_load(tmp_path: Path) -> None:
    path = tmp_path / "edge.jsonl"
    row = {"problem": "y" * MAX_PROMPT_CHARS, "answer": "7" * MAX_ANSWER_CHARS}
    path.write_text(json.dumps(row) + "\n")
    [problem] = load_problems(str(path))
    assert (len(problem.prompt), len(problem.answer)) == (MAX_PROMPT_CHARS, MAX_ANSWER_CHARS)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_50mb_line_is_refused_without_reading_it_whole(tmp_path: Path, suffix: str) -> None:
    # The report: a 50 MB single-line problem took 20 GB of RAM. The line is cut at the limit.
    path = tmp_path / f"huge{suffix}"
    good = json.dumps({"problem": "2+2?", "answer": "4"})
    data = f'{good}\n{{"problem": "{"z" * 50_000_000}", "answer": "1"}}\n'.encode()
    path.write_bytes(gzip.compress(data, compresslevel=1) if suffix.endswith(".gz") else data)
    with pytest.raises(ValueError) as err:
        load_problems(str(path))
    assert (
        str(err.value) == f"{path} row 2: longer than {MAX_ROW_BYTES:,} bytes, the limit of a row"
    )


def test_verl_layout_problem_over_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.parquet"
    long_problem = "w" * (MAX_PROMPT_CHARS + 1)
    _write_parquet(
        path,
        [
            {
                "prompt": [{"role": "user", "content": DAPO_PREFIX + long_problem + DAPO_SUFFIX}],
                "reward_model": {"ground_truth": "1", "style": "rule"},
            }
        ],
    )
    with pytest.raises(ValueError, match=r"big\.parquet row 1: the problem has 32,769 characters"):
        load_problems(str(path))


def test_non_utf8_and_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"problem": "ok", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"latin\.jsonl row 2: not UTF-8"):
        load_problems(str(path))
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"problem": "ok", "answer": "1"}\n' * 50)[:40])
    with pytest.raises(ValueError, match="cannot read the file"):
        load_problems(str(gz))


# --- prompt templates ---------------------------------------------------------------------------
PROBLEM = Problem(prompt="What is 6*7?", answer="42", source="t", idx=0)
DAPO_TEXT = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "What is 6*7?\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def test_format_prompt_dapo_and_raw() -> None:
    tok = build_tiny_tokenizer()
    assert format_prompt(PROBLEM, "dapo", tok) == DAPO_TEXT
    assert format_prompt(PROBLEM, "raw", tok) == "What is 6*7?"
    with pytest.raises(ValueError, match="prompt template 'jinja'"):
        format_prompt(PROBLEM, "jinja", tok)


def test_format_prompt_chat_uses_the_tokenizers_template() -> None:
    tok = build_tiny_tokenizer()
    # No chat template: falls back to the DAPO instruction.
    assert format_prompt(PROBLEM, "chat", tok) == DAPO_TEXT
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    assert format_prompt(PROBLEM, "chat", tok) == f"<|user|>{DAPO_TEXT}<|end|><|assistant|>"
