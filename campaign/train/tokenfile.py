"""Token files for the built-in trainer: how `campaign data prepare` writes them and what
the trainer learns from them (numpy only; no torch, so the CLI can prepare data quickly).

A token file is a flat array of token ids (uint16 or uint32, no header): nanoGPT's
`train.bin`/`val.bin` layout, read as a memmap. `campaign data prepare` writes a JSON
sidecar next to it, `OUT.json` (e.g. `train.bin.json`):

    {"format": "campaign-tokens", "version": 1, "dtype": "uint32", "vocab_size": 128256,
     "tokens": 1234567, "documents": 12, "tokenizer": "tokenizer.json", "eos_id": 128001}

The trainer reads it (`resolve`): the file's dtype, and the model's vocabulary when the spec
does not set `model.vocab_size`. A file without a sidecar (nanoGPT's) is read as it is:
`data.dtype` (default uint16) and the model size's vocabulary, each window checked against it.

    prepare_text(["a.txt"], "t.bin")                               # bytes: token = byte + 1, 0 ends a document
    prepare_tokenized(["a.txt"], "t.bin", "tokenizer.json")        # a Hugging Face tokenizer (extra `data`)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from campaign.errors import DataError

FORMAT = "campaign-tokens"
UINT16_IDS = 65536
"""A vocabulary of at most this many ids (0..65535) fits uint16; a larger one needs uint32."""
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
"""End-of-text tokens looked for, in this order, when --eos is not given (GPT-2, Llama 3, Llama 2, ...)."""
PIECE_CHARS = 1 << 18
"""Text is encoded in pieces of about this many characters, BATCH_PIECES at a time, in parallel
(encode_batch). A batch's encodings hold ~75 bytes per character (ids, offsets, token strings):
4 MiB of text per batch keeps the peak near 300 MB."""
BATCH_PIECES = 16
BYTE_VOCAB = 257


@dataclass(frozen=True)
class TokenFileInfo:
    """What a sidecar records about its token file."""

    dtype: str
    vocab_size: int
    tokens: int
    documents: int
    tokenizer: str
    """`bytes` (the byte-level tokenizer) or the tokenizer file's name."""
    eos_id: int | None


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(path)}.json")


def read_sidecar(path: str | os.PathLike[str]) -> TokenFileInfo | None:
    """The sidecar of token file `path`, or None when it has none (a nanoGPT file).
    Raises DataError when the sidecar is not one `write_sidecar` wrote."""
    side = sidecar_path(path)
    try:
        raw = json.loads(side.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{side}: not a token file sidecar ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DataError(f"{side}: not a token file sidecar (no \"format\": \"{FORMAT}\")")
    try:
        info = TokenFileInfo(dtype=str(raw["dtype"]), vocab_size=int(raw["vocab_size"]), tokens=int(raw["tokens"]),
                             documents=int(raw.get("documents", 0)), tokenizer=str(raw.get("tokenizer", "")),
                             eos_id=None if raw.get("eos_id") is None else int(raw["eos_id"]))
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{side}: bad field {e}") from None
    if info.dtype not in ("uint16", "uint32") or info.vocab_size < 2:
        raise DataError(f"{side}: dtype {info.dtype!r} / vocab_size {info.vocab_size} cannot be used")
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror} (its sidecar {side} is there)") from None
    if size != info.tokens * np.dtype(info.dtype).itemsize:
        raise DataError(f"{path} holds {size:,} bytes, not the {info.tokens:,} {info.dtype} tokens its sidecar "
                        f"{side} describes: prepare it again (`campaign data prepare`)")
    return info


def write_sidecar(path: str | os.PathLike[str], info: TokenFileInfo) -> Path:
    side = sidecar_path(path)
    _replace(side, lambda f: f.write(json.dumps({"format": FORMAT, "version": 1, **asdict(info)}, indent=1).encode()))
    return side


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= UINT16_IDS else "uint32"


# --- what the trainer reads -----------------------------------------------------------

def resolve(cfg: Any) -> Any:
    """A TrainerConfig with `data.dtype` and `model.vocab_size` taken from the token
    file's sidecar where the spec leaves them unset (the same config when there is none to
    read). Raises DataError when the spec contradicts the sidecar."""
    model, data = resolve_parts(cfg.model, cfg.data)
    return cfg if (model, data) == (cfg.model, cfg.data) else cfg.model_copy(update={"model": model, "data": data})


def resolve_parts(model: Any, data: Any) -> tuple[Any, Any]:
    """`resolve` on a ModelConfig and a DataConfig (the spec's sections)."""
    if data.source != "file":
        return model, data
    info = read_sidecar(data.path)
    if info is None:
        return model, (data if data.dtype else data.model_copy(update={"dtype": "uint16"}))
    side = sidecar_path(data.path)
    if data.dtype and data.dtype != info.dtype:
        raise DataError(f"data.dtype is {data.dtype} but {side} says the file holds {info.dtype}: "
                        "leave data.dtype out (the sidecar sets it)")
    if model.vocab_size is not None and model.vocab_size < info.vocab_size:
        raise DataError(f"model.vocab_size {model.vocab_size} is smaller than the vocabulary of {data.path} "
                        f"({info.vocab_size}, from {side}): leave model.vocab_size out (the sidecar sets it) "
                        "or make it larger")
    return (model.model_copy(update={"vocab_size": model.vocab_size or info.vocab_size}),
            data.model_copy(update={"dtype": info.dtype}))


def check_visible(model: Any, data: Any) -> None:
    """Before a submission: where the token file is visible from here (an absolute path that
    exists), refuse a spec its sidecar contradicts; elsewhere the trainer checks it."""
    if data.source == "file" and os.path.isabs(data.path) and os.path.exists(data.path):
        resolve_parts(model, data)


def check_window(window: np.ndarray, vocab_size: int, path: str, start: int) -> None:
    """Every id of a window read from `path` must be < the model's vocabulary."""
    top = int(window.max()) if len(window) else 0
    if top >= vocab_size:
        raise DataError(f"{path}: token id {top} near position {start:,} is outside the model's vocabulary "
                        f"({vocab_size}): set model.vocab_size (or prepare the file with `campaign data prepare`, "
                        "whose sidecar sets it)")


# --- writing token files ----------------------------------------------------------------

def prepare_text(paths: list[str | os.PathLike[str]], out_path: str | os.PathLike[str],
                 dtype: str | None = None) -> dict[str, Any]:
    """Tokenize text files byte-wise (token = byte + 1; 0 separates documents) into a flat
    token file and its sidecar. Returns {"path", "tokens", "documents", "dtype", "vocab_size"}."""
    dtype = dtype or "uint16"

    def ids() -> Iterator[tuple[np.ndarray, bool]]:
        for p in paths:
            yield np.frombuffer(Path(p).read_bytes(), dtype=np.uint8).astype(dtype) + 1, True
            yield np.zeros(1, dtype=dtype), False

    return _write(paths, out_path, ids(), dtype=dtype, vocab_size=BYTE_VOCAB, tokenizer="bytes", eos_id=0)


def prepare_tokenized(paths: list[str | os.PathLike[str]], out_path: str | os.PathLike[str],
                      tokenizer_file: str | os.PathLike[str], *, dtype: str | None = None, eos: str | None = None,
                      piece_chars: int = PIECE_CHARS) -> dict[str, Any]:
    """Encode UTF-8 text files with a Hugging Face tokenizer (tokenizer.json) into a flat
    token file, the end-of-text token after each file, and its sidecar. `dtype` None picks
    uint16 when the vocabulary fits, else uint32; `eos` None looks for one of EOS_NAMES,
    "" puts nothing between documents. Raises DataError for bad input (nothing written)."""
    tok = load_tokenizer(tokenizer_file)
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=0) + 1)
    if dtype is None:
        dtype = dtype_for(vocab_size)
    elif dtype == "uint16" and vocab_size > UINT16_IDS:
        raise DataError(f"--dtype uint16 cannot hold the ids of {tokenizer_file} (vocabulary {vocab_size:,}): "
                        "use uint32 or leave --dtype out")
    eos_id = _eos_id(vocab, eos, tokenizer_file)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # the same ids without offsets (tokenizers >= 0.21)

    def ids() -> Iterator[tuple[np.ndarray, bool]]:
        for p in paths:
            for batch in _batches(_pieces(p, piece_chars), BATCH_PIECES):
                for enc in encode(batch, add_special_tokens=False):
                    yield np.asarray(enc.ids, dtype=dtype), True
            if eos_id is not None:
                yield np.asarray([eos_id], dtype=dtype), False

    return _write(paths, out_path, ids(), dtype=dtype, vocab_size=vocab_size, tokenizer=Path(tokenizer_file).name,
                  eos_id=eos_id)


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json; DataError naming the file or the extra."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("--tokenizer needs the Hugging Face `tokenizers` package: pip install 'campaign[data]'") from None
    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as e:  # tokenizers raises a bare Exception with serde's message
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{path}: not a Hugging Face tokenizer file ({first})") from None


def _eos_id(vocab: dict[str, int], eos: str | None, tokenizer_file: Any) -> int | None:
    if eos == "":
        return None
    if eos is not None:
        if eos not in vocab:
            raise DataError(f"--eos {eos!r}: no such token in {tokenizer_file}")
        return vocab[eos]
    for name in EOS_NAMES:
        if name in vocab:
            return vocab[name]
    raise DataError(f"{tokenizer_file}: none of {', '.join(EOS_NAMES)} is a token: name the end-of-text token with "
                    "--eos TOKEN (or --eos '' for nothing between documents)")


_CUT = re.compile(r"\n(?=\S)")


def _pieces(path: str | os.PathLike[str], size: int) -> Iterator[str]:
    """The text of `path` in pieces of about `size` characters, each cut just before a
    newline that a non-space character follows: there, byte-level BPE pre-tokenizers
    (GPT-2's, Llama 3's) split the text anyway, so the pieces encode to the same ids as
    the whole text (a tokenizer that marks a text's start, as Llama 2's does, may differ
    by one token at each cut)."""
    buf = ""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            while block := f.read(size):
                buf += block
                if len(buf) < size:
                    continue
                last = None
                for last in _CUT.finditer(buf, 1):
                    pass
                if last is not None:
                    yield buf[:last.start()]
                    buf = buf[last.start():]
                elif len(buf) >= 64 * size:  # one enormous line: cut it anyway
                    yield buf
                    buf = ""
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at a byte {e.start} of a block); "
                        "without --tokenizer any bytes are accepted") from None
    if buf:
        yield buf


def _batches(items: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _write(paths: list[Any], out_path: str | os.PathLike[str], ids: Iterator[tuple[np.ndarray, bool]], *, dtype: str,
           vocab_size: int, tokenizer: str, eos_id: int | None) -> dict[str, Any]:
    """Write the ids (arrays, and whether they are text or a separator) to a temporary file,
    renamed over `out_path` only when every input was read and one held text; then the
    sidecar. An empty corpus is a DataError."""
    counts = {"tokens": 0, "text": 0}

    def write(f: Any) -> None:
        for a, text in ids:
            f.write(a.tobytes())
            counts["tokens"] += len(a)
            counts["text"] += len(a) if text else 0

    def info() -> TokenFileInfo:
        return TokenFileInfo(dtype=dtype, vocab_size=vocab_size, tokens=counts["tokens"], documents=len(paths),
                             tokenizer=tokenizer, eos_id=eos_id)

    def commit() -> None:  # the sidecar first: a crash before the rename leaves one that does not fit the old file
        if not counts["text"]:
            _empty(paths)
        write_sidecar(out, info())

    out = Path(out_path)
    try:
        _replace(out, write, commit)
    except OSError as e:  # an unreadable input, a missing folder, a full disk: nothing is left half-written
        raise DataError(f"{e.filename or out}: {e.strerror or e}") from None
    return {"path": str(out), **asdict(info())}


def _empty(paths: list[Any]) -> bool:
    raise DataError(f"no text to tokenize: {', '.join(str(p) for p in paths)} "
                    f"{'is' if len(paths) == 1 else 'are'} empty")


def _replace(path: Path, write: Any, commit: Any = lambda: None) -> None:
    """Write `path` through a temporary file beside it, renamed over it once complete and
    `commit()` returned (a crash or a DataError leaves the old file, if any, and no partial one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        commit()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
