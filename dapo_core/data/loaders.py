"""Problems: the named data sets, the user's own files, de-duplication, prompt templates.

`load_problems(name_or_path)` knows these names:

    synthetic       the embedded training task (dapo_core.data.synthetic), 4,096 problems
    synthetic-eval  its held-out set, 256 distinct problems disjoint from training
    arithmetic      easy addition in words for the real model (dapo_core.data.arithmetic), 2,048
    arithmetic-eval its held-out set, 96 distinct problems disjoint from training
    explore         the second embedded task (dapo_core.data.explore): a fork at the first
                    response token, rewarded tokens rare; 4,096 problems
    explore-eval    its held-out set, 256 distinct problems disjoint from training
    lookup          the third embedded task (dapo_core.data.lookup): a key in, one of 8 symbols
                    out; its 32 keys, once each (prompt template `raw-answer`)
    lookup-eval     the same 32 keys (a random table has nothing to generalise), sampled apart
    lookup-coin     the 32 keys, 256 times each, rewarded by a fair coin independent of the
                    answer (the entropy probe; `task_reward`)
    dapo-math-17k   DAPO-Math-17k (shipped), de-duplicated with a report
    aime2024        AIME 2024, 30 problems (shipped)
    aime2025        AIME 2025, 30 problems (shipped)
    gsm8k           GSM8K train, 7,473 problems (not shipped: read from $DAPO_DATA_DIR)
    gsm8k-test      GSM8K test, 1,319 problems (shipped)
    math500         MATH-500, 500 problems (shipped)

Anything else is a path to a `.jsonl`, `.jsonl.gz` or `.parquet` file with one problem per row,
either flat (`problem` or `prompt` text, and `answer`) or in verl's layout (`prompt` a list of
chat messages holding the templated problem, `reward_model.ground_truth`, optionally
`extra_info.raw_problem`). A malformed row is an error that names the file and the row (rows
count from 1, like the lines of a JSONL file), and so is a row over the size limits below: a
problem is text a model reads and an answer a grader compares, so neither is ever megabytes, and
a JSONL line is read with a bound, and a parquet file is sized from its footer and read in
batches, so a corrupt or crafted file cannot exhaust memory. Every file-backed set is de-duplicated the same
way, and what was dropped is logged in words (see `deduplicate`).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_core.data import arithmetic, explore, lookup, synthetic
from dapo_core.data.answer import ANSWER_PREFIX

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# DAPO's instruction template (the DAPO-Math-17k training prompts and its AIME eval file).
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
# Shorter instruction found in some verl-layout releases of DAPO-Math-17k.
_SHORT_PREFIX = "Solve the following math problem step by step.\n\n"

# Size limits, checked as each row is read. The longest problem shipped has 3,190 characters
# (DAPO-Math-17k) and the longest answer 53 (MATH-500); the reference grader reads 300.
MAX_PROMPT_CHARS = 32_768
MAX_ANSWER_CHARS = 1_024
# A JSONL line holds the problem twice at most (verl's layout) plus metadata and escapes.
MAX_ROW_BYTES = 4 * 1024 * 1024
# A parquet file, from its footer before anything is decoded, then as it is read batch by
# batch: verl's DAPO-Math-17k (1.79 M rows, each problem 100 times) fits both. The footer's
# size is of the encoded data, so a dictionary-encoded column can decode to far more; what is
# decoded is counted too, and past the limit the file is refused after one batch more.
MAX_PARQUET_ROWS = 4_000_000
MAX_PARQUET_BYTES = 2 * 1024**3
PARQUET_BATCH_ROWS = 1_024

TEMPLATES: tuple[str, ...] = ("dapo", "chat", "raw", "chat-answer", "raw-answer")
SUFFIXES: tuple[str, ...] = (".jsonl", ".jsonl.gz", ".parquet")
DATA_DIR_ENV = "DAPO_DATA_DIR"


@dataclass(frozen=True)
class Problem:
    """One math problem: its text (without any instruction template) and reference answer."""

    prompt: str
    """The problem statement as the data set gives it."""
    answer: str
    """The ground truth, compared by the configured grader (dapo_core.algo.rewards)."""
    source: str
    """The data set's name, or the file it came from."""
    idx: int
    """Row of the problem in its source (0-based), stable under de-duplication."""


@dataclass(frozen=True)
class _Named:
    file: str
    """File name, in the package's datasets/ or in $DAPO_DATA_DIR."""
    shipped: bool
    about: str


NAMED: dict[str, _Named] = {
    "dapo-math-17k": _Named("dapo_math_17k.jsonl.gz", True, "DAPO-Math-17k"),
    "aime2024": _Named("aime2024.jsonl", True, "AIME 2024"),
    "aime2025": _Named("aime2025.jsonl", True, "AIME 2025"),
    "gsm8k": _Named("gsm8k_train.jsonl", False, "GSM8K train"),
    "gsm8k-test": _Named("gsm8k_test.jsonl", True, "GSM8K test"),
    "math500": _Named("math500.jsonl", True, "MATH-500"),
}
SYNTHETIC, SYNTHETIC_EVAL = "synthetic", "synthetic-eval"
ARITHMETIC, ARITHMETIC_EVAL = "arithmetic", "arithmetic-eval"
EXPLORE, EXPLORE_EVAL = "explore", "explore-eval"
LOOKUP, LOOKUP_EVAL, LOOKUP_COIN = "lookup", "lookup-eval", "lookup-coin"
KNOWN: tuple[str, ...] = (
    SYNTHETIC,
    SYNTHETIC_EVAL,
    ARITHMETIC,
    ARITHMETIC_EVAL,
    EXPLORE,
    EXPLORE_EVAL,
    LOOKUP,
    LOOKUP_EVAL,
    LOOKUP_COIN,
    *NAMED,
)
# Response positions where a named task takes its decision (the trainer reports the entropy
# there beside the mean, `entropy/decision`); a task that names none is absent.
DECISION_POSITIONS: dict[str, tuple[int, ...]] = {
    EXPLORE: explore.DECISION_POSITIONS,
    EXPLORE_EVAL: explore.DECISION_POSITIONS,
    LOOKUP: lookup.DECISION_POSITIONS,
    LOOKUP_EVAL: lookup.DECISION_POSITIONS,
    LOOKUP_COIN: lookup.DECISION_POSITIONS,
}
# The training reward of a named task when it is not the grader's verdict: `coin`, a fair coin
# independent of the answer (dapo_core.data.lookup.coin; the trainer's dapo_core.train.
# task_reward). Evaluation always grades with the grader.
TASK_REWARDS: dict[str, str] = {LOOKUP_COIN: "coin"}


def decision_positions(name_or_path: str) -> tuple[int, ...]:
    """The response positions (0-based) where the data set's task takes its decision; () when
    it names none (every data set but the explore and lookup tasks')."""
    return DECISION_POSITIONS.get(_key(name_or_path), ())


def task_reward(name_or_path: str) -> str:
    """`grader` (the configured grader's verdict, the default) or a task's own training reward
    (TASK_REWARDS: `coin`)."""
    return TASK_REWARDS.get(_key(name_or_path), "grader")


def _key(name_or_path: str) -> str:
    return name_or_path.strip().lower().replace("_", "-")


# --- loading -------------------------------------------------------------------------------
def load_problems(name_or_path: str, seed: int = 0) -> list[Problem]:
    """The problems of a named data set or a file (see the module docstring).

    `seed` draws the synthetic training set (other seeds, other draws from the same training
    split); the held-out synthetic set and every file-backed set do not depend on it.
    """
    return load_problems_with_report(name_or_path, seed)[0]


def _generated(key: str, seed: int) -> Sequence[Any] | None:
    """The tasks of a generated set (each with .text and .answer), None for a file-backed one.
    The training splits are drawn with `seed`; the held-out and the lookup sets are fixed."""
    makers: dict[str, Callable[[], Sequence[Any]]] = {
        SYNTHETIC: lambda: synthetic.train_tasks(synthetic.TRAIN_SIZE, seed),
        SYNTHETIC_EVAL: synthetic.eval_tasks,
        ARITHMETIC: lambda: arithmetic.train_tasks(arithmetic.TRAIN_SIZE, seed),
        ARITHMETIC_EVAL: arithmetic.eval_tasks,
        EXPLORE: lambda: explore.train_tasks(explore.TRAIN_SIZE, seed),
        EXPLORE_EVAL: explore.eval_tasks,
        LOOKUP: lookup.train_tasks,
        LOOKUP_EVAL: lookup.eval_tasks,
        LOOKUP_COIN: lookup.coin_tasks,
    }
    make = makers.get(key)
    return None if make is None else make()


def load_problems_with_report(
    name_or_path: str, seed: int = 0
) -> tuple[list[Problem], DedupReport | None]:
    """load_problems plus the de-duplication report (None for the generated synthetic sets)."""
    key = _key(name_or_path)
    generated = _generated(key, seed)
    if generated is not None:
        return [Problem(t.text, str(t.answer), key, i) for i, t in enumerate(generated)], None
    if key in NAMED:
        path, label, source = _named_path(key), NAMED[key].file, key
    else:
        path = _user_path(name_or_path)
        label = source = name_or_path
    problems = [_problem(row, n, label, source) for n, row in _rows(path, label)]
    kept, report = deduplicate(problems, source)
    if report.dropped:
        log.warning("%s", report.describe())
    else:
        log.info("%s", report.describe())
    return kept, report


def _named_path(key: str) -> Path:
    spec = NAMED[key]
    if spec.shipped:
        return Path(str(resources.files("dapo_core.data.datasets").joinpath(spec.file)))
    env = os.environ.get(DATA_DIR_ENV)
    if not env:
        raise FileNotFoundError(
            f"{key} ({spec.about}, {spec.file}) is too big to ship with the package: set "
            f"{DATA_DIR_ENV} to a directory that holds {spec.file}"
        )
    path = Path(env).expanduser() / spec.file
    if not path.is_file():
        raise FileNotFoundError(f"{key}: {path} does not exist ({DATA_DIR_ENV}={env})")
    return path


def _user_path(name: str) -> Path:
    path = Path(name).expanduser()
    known = ", ".join(KNOWN)
    if not path.exists():
        if name.lower().endswith((*SUFFIXES, ".json", ".csv", ".gz")) or "/" in name:
            raise FileNotFoundError(
                f"data file {name} does not exist (or name a data set: {known})"
            )
        raise ValueError(
            f"unknown data set {name!r}: use one of {known}, or a .jsonl/.jsonl.gz/.parquet path"
        )
    if not path.is_file():
        raise ValueError(f"data path {name} is not a file: give a .jsonl/.jsonl.gz/.parquet file")
    if not path.name.lower().endswith(SUFFIXES):
        raise ValueError(f"data file {name}: unsupported format; use .jsonl, .jsonl.gz or .parquet")
    return path


def _rows(path: Path, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number from 1, row as a dict) for every non-blank row of the file."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        yield from _parquet_rows(path, label)
        return
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            n = 0
            # readline with a limit: an over-long line is never held in memory whole.
            while raw := handle.readline(MAX_ROW_BYTES + 1):
                n += 1
                if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                    raise ValueError(
                        f"{label} row {n}: longer than {MAX_ROW_BYTES:,} bytes, the limit of a row"
                    )
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    raise ValueError(f"{label} row {n}: not UTF-8 text") from None
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{label} row {n}: not valid JSON ({exc.msg})") from None
                except RecursionError:  # [[[[... : the parser recurses once per level
                    raise ValueError(f"{label} row {n}: JSON nested too deeply") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{label} row {n}: expected a JSON object")
                yield n, row
    except (OSError, EOFError) as exc:  # a truncated or corrupt .gz
        raise ValueError(f"{label}: cannot read the file ({exc})") from None


def _parquet_rows(path: Path, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a parquet file, its size checked from the footer before any data is decoded
    (a few kB of zstd can decode to gigabytes), then read batch by batch."""
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not parquet
        raise ValueError(f"{label}: not a readable parquet file ({exc})") from None
    with handle:
        meta = handle.metadata
        if meta.num_rows > MAX_PARQUET_ROWS:
            raise ValueError(
                f"{label}: {meta.num_rows:,} rows, more than the {MAX_PARQUET_ROWS:,} a data "
                "file may hold"
            )
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if size > MAX_PARQUET_BYTES:
            raise ValueError(
                f"{label}: decodes to {size:,} bytes, more than the {MAX_PARQUET_BYTES:,} a data "
                "file may hold"
            )
        n, decoded = 0, 0
        batches = handle.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        while True:
            try:
                batch = next(batches, None)
            except Exception as exc:  # corrupt pages, a footer that does not match the data
                raise ValueError(f"{label}: not a readable parquet file ({exc})") from None
            if batch is None:
                return
            # The footer's sizes are the file's word: count what is really decoded too.
            decoded += batch.nbytes
            if decoded > MAX_PARQUET_BYTES:
                raise ValueError(
                    f"{label}: decodes to more than {MAX_PARQUET_BYTES:,} bytes (its footer "
                    f"said {size:,})"
                )
            for row in batch.to_pylist():
                n += 1
                yield n, row


def _problem(row: dict[str, Any], n: int, label: str, source: str) -> Problem:
    """One row, flat or in verl's layout, as a Problem; a ValueError names file and row."""
    where = f"{label} row {n}"
    prompt = row.get("prompt")
    if isinstance(prompt, list):  # verl: [{"role": "user", "content": templated problem}]
        text = _verl_problem(row, prompt, where)
        reward_model = row.get("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise ValueError(f"{where}: missing 'reward_model.ground_truth'")
        answer = _answer(reward_model["ground_truth"], where, "reward_model.ground_truth")
    else:
        raw: Any
        if "problem" in row:
            raw, key = row["problem"], "problem"
        elif "prompt" in row:
            raw, key = prompt, "prompt"
        else:
            raise ValueError(f"{where}: missing 'problem' (or 'prompt')")
        if not isinstance(raw, str):
            raise ValueError(f"{where}: {key!r} must be text, not {type(raw).__name__}")
        text = raw
        if "answer" not in row:
            raise ValueError(f"{where}: missing 'answer'")
        answer = _answer(row["answer"], where, "answer")
    if not text.strip():
        raise ValueError(f"{where}: the problem text is empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(
            f"{where}: the problem has {len(text):,} characters, more than the limit of "
            f"{MAX_PROMPT_CHARS:,}"
        )
    return Problem(prompt=text, answer=answer, source=source, idx=n - 1)


def _verl_problem(row: dict[str, Any], messages: list[Any], where: str) -> str:
    extra = row.get("extra_info")
    raw = extra.get("raw_problem") if isinstance(extra, dict) else None
    if isinstance(raw, str) and raw.strip():
        return raw
    users = [m for m in messages if isinstance(m, dict) and m.get("role", "user") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise ValueError(f"{where}: 'prompt' holds no user message with text content")
    return strip_template(users[-1]["content"])


def strip_template(text: str) -> str:
    """The problem inside DAPO's instruction template (text without it is returned as is)."""
    for prefix in (DAPO_PREFIX, _SHORT_PREFIX):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    return text.removesuffix(DAPO_SUFFIX)


def _answer(value: Any, where: str, key: str) -> str:
    if isinstance(value, bool) or value is None or not isinstance(value, str | int | float):
        raise ValueError(f"{where}: {key!r} must be text or a number, not {value!r:.40}")
    text = str(value).strip()
    if not text:
        raise ValueError(f"{where}: {key!r} is empty")
    if len(text) > MAX_ANSWER_CHARS:
        raise ValueError(
            f"{where}: {key!r} has {len(text):,} characters, more than the limit of "
            f"{MAX_ANSWER_CHARS:,}"
        )
    return text


# --- de-duplication ----------------------------------------------------------------------------
@dataclass
class DedupReport:
    """What de-duplication kept and dropped from one source."""

    source: str
    rows: int
    """Rows read."""
    kept: int = 0
    exact_duplicates: int = 0
    """Rows that repeat an earlier row's problem and answer (the first copy is kept)."""
    conflicting: list[tuple[str, list[str], list[int]]] = field(default_factory=list)
    """Problems whose copies disagree on the answer: (problem, answers, rows), all dropped."""
    float_artefacts: list[tuple[int, str]] = field(default_factory=list)
    """(row, answer) of integer answers that are a float's exact expansion, dropped."""

    @property
    def conflicting_rows(self) -> int:
        return sum(len(rows) for _, _, rows in self.conflicting)

    @property
    def dropped(self) -> int:
        return self.rows - self.kept

    def describe(self, max_named: int = 20) -> str:
        """The report in words; names every conflicting problem (up to max_named)."""
        if not self.dropped:
            return f"{self.source}: {self.rows:,} problems, no duplicates"
        parts = []
        if self.exact_duplicates:
            parts.append(f"{self.exact_duplicates:,} exact duplicate rows")
        if self.conflicting:
            named = "; ".join(
                f"rows {'/'.join(str(r + 1) for r in rows)} {_short(problem)!r} answers "
                f"{' vs '.join(answers)}"
                for problem, answers, rows in self.conflicting[:max_named]
            )
            more = len(self.conflicting) - max_named
            parts.append(
                f"{self.conflicting_rows} rows of {len(self.conflicting)} problems with "
                f"conflicting answers ({named}{f'; and {more} more' if more > 0 else ''})"
            )
        if self.float_artefacts:
            shown = ", ".join(f"row {r + 1} answer {a}" for r, a in self.float_artefacts)
            parts.append(
                f"{len(self.float_artefacts)} rows whose answer is a float artefact ({shown})"
            )
        return f"{self.source}: kept {self.kept:,} of {self.rows:,} problems; dropped " + ", ".join(
            parts
        )


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_LONG_INT = re.compile(r"-?\d{17,}")


def is_float_artefact(answer: str) -> bool:
    """True for an integer of 17+ digits written as the exact expansion of a binary double that
    prints shorter, e.g. 22099999999999998951424 (= float 2.21e22): the signature of an answer
    passed through int(float(x)), whose true value is lost. Powers of two are left alone."""
    if not _LONG_INT.fullmatch(answer):
        return False
    value = abs(int(answer))
    if value & (value - 1) == 0:
        return False
    try:
        as_float = float(value)
    except OverflowError:
        return False
    if int(as_float) != value:
        return False
    mantissa = repr(as_float).split("e")[0].replace(".", "").strip("0")
    return len(mantissa) < len(str(value).rstrip("0"))


def deduplicate(problems: list[Problem], source: str) -> tuple[list[Problem], DedupReport]:
    """Drop float-artefact answers, then exact duplicates (problem and answer), then every copy
    of a problem that appears with different answers. Order is otherwise kept."""
    report = DedupReport(source=source, rows=len(problems))
    clean: list[Problem] = []
    for p in problems:
        if is_float_artefact(p.answer):
            report.float_artefacts.append((p.idx, p.answer))
        else:
            clean.append(p)
    answers: dict[str, list[Problem]] = {}
    for p in clean:
        answers.setdefault(p.prompt, []).append(p)
    conflicting: set[str] = set()
    for text, copies in answers.items():
        distinct = sorted({c.answer for c in copies})
        if len(distinct) > 1:
            conflicting.add(text)
            report.conflicting.append((text, distinct, [c.idx for c in copies]))
    kept: list[Problem] = []
    seen: set[str] = set()
    for p in clean:
        if p.prompt in conflicting:
            continue
        if p.prompt in seen:
            report.exact_duplicates += 1
            continue
        seen.add(p.prompt)
        kept.append(p)
    report.kept = len(kept)
    return kept, report


# --- prompts ---------------------------------------------------------------------------------
def dapo_prompt(problem_text: str) -> str:
    """DAPO's instruction template around a problem."""
    return DAPO_PREFIX + problem_text + DAPO_SUFFIX


def format_prompt(problem: Problem, template: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """The text the policy is prompted with.

    `dapo`: DAPO's instruction template; `chat`: the tokenizer's chat template (one user turn
    holding the DAPO template, with the generation prompt) when it has one, else `dapo`;
    `raw`: the problem text as is (the tiny preset, whose model never saw an instruction);
    `chat-answer`: the tokenizer's chat template around the bare problem, with the assistant's
    reply begun as `Answer: ` (ANSWER_PREFIX; a small instruct model rarely writes the answer
    line when asked in words, see dapo_core.data.arithmetic). It needs a chat template.
    `raw-answer`: the problem text as is, then ANSWER_PREFIX (the lookup task, whose reply is one
    symbol and EOS: dapo_core.data.lookup).
    """
    if template == "raw":
        return problem.prompt
    if template == "raw-answer":
        return problem.prompt + ANSWER_PREFIX
    if template == "dapo":
        return dapo_prompt(problem.prompt)
    if template == "chat":
        text = dapo_prompt(problem.prompt)
        if getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            return str(rendered)
        return text
    if template == "chat-answer":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.prompt_template=chat-answer needs a tokenizer with a chat template"
            )
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": problem.prompt}],
            tokenize=False,
            add_generation_prompt=True,
        )
        return str(rendered) + ANSWER_PREFIX
    raise ValueError(f"prompt template {template!r}: use one of {', '.join(TEMPLATES)}")


def response_prefix(template: str) -> str:
    """What the prompt of `template` has already written of the response.

    The grader must read what a reader of the assistant's turn reads: with `chat-answer` the
    response is `42`, and the `Answer: 42` line the reference grader looks for (its last
    `Answer:` line) is this prefix + the response. Grading the response alone would mark every
    reply wrong; asking the model to repeat `Answer:` would change the task.
    """
    return ANSWER_PREFIX if template in ("chat-answer", "raw-answer") else ""


def graded_text(template: str, response: str) -> str:
    """The text the grader is given for a response sampled after a `template` prompt."""
    return response_prefix(template) + response
