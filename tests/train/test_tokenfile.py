"""Real tokenizers (issue 42, item 5): `campaign data prepare --tokenizer tokenizer.json` writes
a uint16/uint32 token file and its sidecar; the built-in trainer reads both (dtype, and the
model's vocabulary from the sidecar); nanoGPT's raw train.bin is read as it is.

The tokenizers are trained here with Hugging Face `tokenizers` (a GPT-2-style byte-level
BPE), or built from a vocabulary (a word-level one of 70,000 ids): nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tokenizers  # the `data` extra; the `test` extra has it too (make test installs it)
from click.testing import CliRunner
from train_helpers import REPO, tiny_config

from campaign.cli import main
from campaign.errors import DataError
from campaign.train import tokenfile
from campaign.train.config import TrainerConfig

WORDS = ["the", "loss", "falls", "node", "stalls", "rank", "checkpoint", "resumes", "token", "batch", "step",
         "campaign", "ledger", "scaling", "efficiency", "gradient", "optimizer", "schedule", "warmup", "aurora"]


SYLLABLES = ["ka", "lo", "mi", "nu", "re", "sa", "ti", "vo", "ze", "gra", "pho", "stu", "qui", "bel", "dor"]
MADE_UP = sorted({"".join(random.Random(i).choices(SYLLABLES, k=1 + i % 3)) for i in range(3000)})
"""About 1,100 made-up words beside WORDS: enough for a BPE vocabulary of 1,000 to fill."""


def corpus(n_lines: int, seed: int) -> str:
    """Lines of words (Zipf-like: a few frequent ones), numbers, punctuation, blank lines and
    indented lines (what pieces are cut around)."""
    rng = random.Random(seed)
    words_by_rank = WORDS + MADE_UP
    weights = [1 / (1 + r) for r in range(len(words_by_rank))]
    lines = []
    for i in range(n_lines):
        words = " ".join(rng.choices(words_by_rank, weights, k=rng.randint(3, 12)))
        lines.append(rng.choice(["", "  ", "\t", "# "]) + words + rng.choice([".", ",", "!", " 42", "  ", ""]))
        if i % 7 == 0:
            lines.append("")
    return "\n".join(lines) + "\n"


def train_bpe(path: Path, vocab_size: int = 600) -> tokenizers.Tokenizer:
    """A GPT-2-style byte-level BPE tokenizer with <|endoftext|>, trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus(400, seed) for seed in range(5)], trainer)
    tok.save(str(path))
    return tok


@pytest.fixture
def bpe(tmp_path: Path) -> tuple[Path, tokenizers.Tokenizer]:
    path = tmp_path / "tokenizer.json"
    return path, train_bpe(path)


def prepare(*args: str) -> object:
    return CliRunner().invoke(main, ["data", "prepare", *args])


def test_prepare_with_a_tokenizer_writes_its_ids_and_a_sidecar(tmp_path, bpe):
    tok_path, tok = bpe
    texts = [corpus(50, 10), corpus(30, 11)]
    for i, t in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(t)
    r = prepare(str(tmp_path / "0.txt"), str(tmp_path / "1.txt"), "--out", str(tmp_path / "t.bin"),
                "--tokenizer", str(tok_path))
    assert r.exit_code == 0, r.output
    eos = tok.token_to_id("<|endoftext|>")
    want = [i for t in texts for i in [*tok.encode(t, add_special_tokens=False).ids, eos]]
    assert np.fromfile(tmp_path / "t.bin", dtype=np.uint16).tolist() == want
    side = json.loads((tmp_path / "t.bin.json").read_text())
    assert side == {"format": "campaign-tokens", "version": 1, "dtype": "uint16", "vocab_size": tok.get_vocab_size(),
                    "tokens": len(want), "documents": 2, "tokenizer": "tokenizer.json", "eos_id": eos}
    assert f"{len(want):,} tokens from 2 document(s), uint16, vocabulary {tok.get_vocab_size():,}" in r.output


def test_pieces_encode_to_the_ids_of_the_whole_text(tmp_path, bpe):
    """Long files are encoded in pieces (cut before a newline that starts a line of text): the
    ids are those of the whole text, trailing spaces, blank lines and indentation included."""
    tok_path, tok = bpe
    text = corpus(300, 3)
    (tmp_path / "a.txt").write_text(text)
    tokenfile.prepare_tokenized([tmp_path / "a.txt"], tmp_path / "t.bin", tok_path, eos="", piece_chars=64)
    assert len(list(tokenfile._pieces(tmp_path / "a.txt", 64))) > 50
    assert np.fromfile(tmp_path / "t.bin", dtype=np.uint16).tolist() == tok.encode(text, add_special_tokens=False).ids


def test_a_vocabulary_past_65536_ids_is_written_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, **{f"w{i}": i for i in range(2, 70_000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    (tmp_path / "a.txt").write_text("w5 w65535 w65536 w69999 nope")
    r = prepare(str(tmp_path / "a.txt"), "--out", str(tmp_path / "t.bin"), "--tokenizer", str(tmp_path / "big.json"))
    assert r.exit_code == 0, r.output
    assert np.fromfile(tmp_path / "t.bin", dtype=np.uint32).tolist() == [5, 65535, 65536, 69999, 0, 1]
    assert tokenfile.read_sidecar(tmp_path / "t.bin").dtype == "uint32"
    r = prepare(str(tmp_path / "a.txt"), "--out", str(tmp_path / "u.bin"), "--tokenizer", str(tmp_path / "big.json"),
                "--dtype", "uint16")
    assert r.exit_code == 2 and "--dtype uint16 cannot hold" in r.output and not (tmp_path / "u.bin").exists()


@pytest.mark.parametrize("case", ["not_a_tokenizer", "empty_corpus", "not_utf8", "unknown_eos", "out_in_no_folder"])
def test_bad_input_is_one_line_and_exit_2_and_nothing_written(tmp_path, bpe, case):
    tok_path, _ = bpe
    text = tmp_path / "a.txt"
    text.write_text("the loss falls\n")
    args = [str(text), "--out", str(tmp_path / "t.bin"), "--tokenizer", str(tok_path)]
    want = {"not_a_tokenizer": "not a Hugging Face tokenizer file", "empty_corpus": "no text to tokenize",
            "not_utf8": "not UTF-8 text", "unknown_eos": "--eos '<nope>': no such token",
            "out_in_no_folder": "No such file or directory"}[case]
    if case == "not_a_tokenizer":
        (tmp_path / "fake.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
        args[-1] = str(tmp_path / "fake.json")
    elif case == "empty_corpus":
        text.write_text("")
        (tmp_path / "b.txt").write_text("")
        args.insert(1, str(tmp_path / "b.txt"))
    elif case == "not_utf8":
        text.write_bytes(b"the loss \xff\xfe falls\n")
    elif case == "unknown_eos":
        args += ["--eos", "<nope>"]
    else:
        args[2] = str(tmp_path / "no" / "t.bin")
    r = prepare(*args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and want in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert "Traceback" not in r.output
    assert not [p for p in tmp_path.rglob("*") if "t.bin" in p.name]  # no token file, sidecar or temporary file


def test_an_empty_byte_level_corpus_is_refused_and_an_old_file_kept(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    assert prepare(str(tmp_path / "a.txt"), "--out", str(tmp_path / "t.bin")).exit_code == 0
    before = (tmp_path / "t.bin").read_bytes(), (tmp_path / "t.bin.json").read_text()
    (tmp_path / "a.txt").write_text("")
    r = prepare(str(tmp_path / "a.txt"), "--out", str(tmp_path / "t.bin"))
    assert r.exit_code == 2 and "no text to tokenize" in r.output
    assert ((tmp_path / "t.bin").read_bytes(), (tmp_path / "t.bin.json").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "t.bin", "t.bin.json"]


def test_without_the_data_extra_the_message_names_it(tmp_path, bpe):
    """`tokenizers` made unimportable in a fresh interpreter (as in a wheel installed without extras)."""
    tok_path, _ = bpe
    (tmp_path / "a.txt").write_text("the loss falls\n")
    code = ("import sys; sys.modules['tokenizers'] = None\n"
            "from campaign.cli import main\n"
            f"main(['data', 'prepare', {str(tmp_path / 'a.txt')!r}, '--out', {str(tmp_path / 't.bin')!r}, "
            f"'--tokenizer', {str(tok_path)!r}])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == ("error: --tokenizer needs the Hugging Face `tokenizers` package: "
                                "pip install 'campaign[data]'")


def _cfg(tmp_path: Path, data: dict, model: dict | None = None) -> TrainerConfig:
    return TrainerConfig.model_validate(tiny_config(tmp_path / "ck", data=data, model={"size": "tiny", **(model or {})}))


def test_the_sidecar_sets_dtype_and_vocabulary_and_contradictions_are_refused(tmp_path):
    tokenfile.prepare_text([_write(tmp_path / "a.txt", "x" * 500)], tmp_path / "t.bin", "uint32")
    cfg = tokenfile.resolve(_cfg(tmp_path, {"source": "file", "path": str(tmp_path / "t.bin")}))
    assert (cfg.data.dtype, cfg.model.vocab_size) == ("uint32", 257)
    with pytest.raises(DataError, match="data.dtype is uint16 but .*t.bin.json says the file holds uint32"):
        tokenfile.resolve(_cfg(tmp_path, {"source": "file", "path": str(tmp_path / "t.bin"), "dtype": "uint16"}))
    with pytest.raises(DataError, match=r"model.vocab_size 200 is smaller than the vocabulary .* \(257"):
        tokenfile.resolve(_cfg(tmp_path, {"source": "file", "path": str(tmp_path / "t.bin")}, {"vocab_size": 200}))
    assert tokenfile.resolve(_cfg(tmp_path, {"source": "file", "path": str(tmp_path / "t.bin")},
                                  {"vocab_size": 512})).model.vocab_size == 512
    # a token file replaced behind its sidecar's back (or a crash between the two) is refused
    (tmp_path / "t.bin").write_bytes(b"\0" * 40)
    with pytest.raises(DataError, match="holds 40 bytes, not the 501 uint32 tokens"):
        tokenfile.resolve(_cfg(tmp_path, {"source": "file", "path": str(tmp_path / "t.bin")}))
    # nanoGPT's file: no sidecar, read as uint16 with the size's vocabulary
    cfg = tokenfile.resolve(_cfg(tmp_path, {"source": "file", "path": str(tmp_path / "raw.bin")}))
    assert (cfg.data.dtype, cfg.model.vocab_size) == ("uint16", None)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_builtin_trainer_trains_on_a_prepared_file_with_the_tokenizers_vocabulary(tmp_path, launch):
    """A BPE vocabulary of 1,000 (tiny's default is 256): the model follows the sidecar,
    so its first loss is about ln(1000), and it learns."""
    tok_path = tmp_path / "tokenizer.json"
    tok = train_bpe(tok_path, vocab_size=1000)
    assert tok.get_vocab_size() == 1000
    texts = [_write(tmp_path / f"{i}.txt", corpus(300, 20 + i)) for i in range(3)]
    r = prepare(*map(str, texts), "--out", str(tmp_path / "train.bin"), "--tokenizer", str(tok_path))
    assert r.exit_code == 0, r.output
    assert int(np.fromfile(tmp_path / "train.bin", dtype=np.uint16).max()) > 256  # ids tiny's 256 could not embed
    cfg = tiny_config(tmp_path / "ck", data={"source": "file", "path": str(tmp_path / "train.bin")},
                      train={"lr": 3e-3}, run={"max_steps": 30})
    run = launch(cfg, world=1, name="bpe")
    assert run.wait() == [0], run.logs()
    losses = run.losses()
    assert sorted(losses) == list(range(1, 31))
    assert abs(losses[1] - math.log(1000)) < 0.5, losses[1]
    assert losses[30] < losses[1] - 1.0, losses


def test_nanogpt_train_bin_is_read_as_it_is_and_ids_past_the_vocabulary_stop_the_trainer(tmp_path, launch):
    """nanoGPT's prepare.py writes `np.array(ids, dtype=np.uint16).tofile("train.bin")`, no
    header, no sidecar: the trainer reads it with the size's vocabulary; an id past that
    vocabulary is a bad-data exit (93: do not retry) with one line naming the file."""
    rng = np.random.default_rng(0)
    np.array(rng.integers(0, 256, size=20_000), dtype=np.uint16).tofile(tmp_path / "train.bin")
    run = launch(tiny_config(tmp_path / "ck", data={"source": "file", "path": str(tmp_path / "train.bin")}),
                 world=1, name="nanogpt")
    assert run.wait() == [0], run.logs()
    assert sorted(run.losses()) == [1, 2, 3, 4, 5]
    np.array(rng.integers(0, 50257, size=20_000), dtype=np.uint16).tofile(tmp_path / "gpt2.bin")
    run = launch(tiny_config(tmp_path / "ck2", data={"source": "file", "path": str(tmp_path / "gpt2.bin")}),
                 world=1, name="gpt2")
    assert run.wait() == [93], run.logs()
    assert "campaign.train: bad data: " in run.logs() and "outside the model's vocabulary (256)" in run.logs()


def test_submit_refuses_a_spec_that_contradicts_the_sidecar_before_anything_runs(tmp_path):
    import yaml

    tokenfile.prepare_text([_write(tmp_path / "a.txt", "x" * 500)], tmp_path / "t.bin", "uint32")
    spec = {"name": "tok", "site": {"kind": "local", "nodes": 1}, "model": {"size": "tiny"},
            "data": {"source": "file", "path": str(tmp_path / "t.bin"), "dtype": "uint16"},
            "stages": [{"name": "smoke", "kind": "smoke", "steps": 2}]}
    (tmp_path / "tok.yaml").write_text(yaml.safe_dump(spec))
    work = tmp_path / "campaigns"
    said = (f"data.path: data.dtype is uint16 but {tmp_path / 't.bin.json'} says the file holds uint32: leave "
            "data.dtype out (the sidecar sets it)")
    r = CliRunner().invoke(main, ["submit", str(tmp_path / "tok.yaml"), "--workdir", str(work)])
    assert r.exit_code == 2, r.output
    assert f"preflight refused the submission (1 problem;" in r.output and f"\n  {said}" in r.output
    r = CliRunner().invoke(main, ["submit", str(tmp_path / "tok.yaml"), "--workdir", str(work), "--dry-run"])
    assert r.exit_code == 0 and f"\n  refuse  {said}" in r.output  # the dry run shows it above the plan
    assert not work.exists()
    spec["data"].pop("dtype")
    (tmp_path / "tok.yaml").write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(main, ["submit", str(tmp_path / "tok.yaml"), "--workdir", str(work), "--dry-run"])
    assert r.exit_code == 0, r.output
