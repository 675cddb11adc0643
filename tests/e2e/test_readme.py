"""README.md's "Using it" block, run as printed (issue 40: "every command in README works as
printed"): each line is run as its own `campaign` process, in README order, in a workspace
where `examples/` is the repository's and the ledger is the workspace's, once the demo
campaign (`campaign submit examples/local.yaml`, the block's own line) has run.

A line with alternatives (`[--json | --watch]`, `list | exclude NODE | include NODE`) is run
once per alternative. Placeholders (NODE, x.yaml, UUID, my_train.py, corpus/*.txt, data.bin,
the Postgres URL) are filled from PLACEHOLDERS. Each run must exit 0, or end in the refusal
README documents for it (REFUSALS: the exit code and the line that says why). A line the test
does not know how to run fails it: the block and this test change together.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "examples" / "trainers" / "train_ddp_campaign.py"
UUID = "6f1b4b0e-3a5d-4a6e-9c43-6d8f0b1c2a7e"
REFUSALS = {
    # README: "exit 2 here: YOUR_PROJECT, no reference, no qsub" (the preflight's list)
    "campaign validate examples/auroragpt-2b.yaml --preflight":
        (2, "refuse  site.account: 'YOUR_PROJECT' is a placeholder"),
    # README: "refused when no driver runs"
    "campaign cancel local-demo": (2, "'local-demo' is not running"),
    # README: "refused at once if nothing runs"
    "campaign inject local-demo kill --rank 1 --after-step 50": (2, "'local-demo' is not running (state succeeded)"),
    # README, exit codes: "2 bad input": no Globus credentials on this machine (docs/remote.md)
    f"campaign submit examples/local.yaml --endpoint {UUID}": (2, "no Globus credentials"),
}
ANSWERS = {"campaign forget local-demo": "n\n"}
"""Questions a line asks, and the answer given (`forget` asks; "n" keeps the campaign for the lines after)."""


def using_it_block() -> list[str]:
    """The command lines of README's "Using it" block, comments stripped."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("campaign ")]


def expand(line: str) -> list[str]:
    """Every alternative a printed line stands for: `[A | B]` -> without, with A, with B;
    `a | b X | c X` after the command group -> `... a`, `... b X`, `... c X`."""
    m = re.search(r"\[([^\]]+)\]", line)
    if m:
        head, tail = line[:m.start()].rstrip(), line[m.end():]
        return [out for alt in ["", *m.group(1).split("|")]
                for out in expand(f"{head} {alt.strip()}{tail}".strip() if alt else f"{head}{tail}")]
    if " | " in line:
        first, *rest = line.split(" | ")
        words = first.split()
        prefix = " ".join(words[:-1])  # `campaign nodes list` -> `campaign nodes`
        return [first, *(f"{prefix} {alt}" for alt in rest)]
    return [line]


@pytest.fixture
def workspace(tmp_path: Path, new_pg_url: Callable[[], str]) -> tuple[Path, dict[str, str], dict[str, str]]:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"doc{i}.txt").write_text(f"document {i}: " + "the quick brown fox " * 50)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAMPAIGN_", "GLOBUS_COMPUTE_CLIENT"))}
    env.update(CAMPAIGN_WORKDIR=str(tmp_path / "campaigns"), PYTHONUNBUFFERED="1",
               GLOBUS_COMPUTE_USER_DIR=str(tmp_path / "globus"))
    fill = {"NODE": "local-n9", "x.yaml": "examples/local.yaml", "UUID": UUID, "my_train.py": str(TRAINER),
            "postgresql://me@dbhost/campaigns": new_pg_url(), "tokenizer.json": _tokenizer(tmp_path, corpus)}
    return tmp_path, env, fill



def _tokenizer(tmp_path: Path, corpus: Path) -> str:
    """A small BPE tokenizer trained on the corpus here (no download), with GPT-2's end-of-text token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"])
    tok.train([str(p) for p in sorted(corpus.iterdir())], trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def run_line(line: str, cwd: Path, env: dict[str, str], fill: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = []
    for word in shlex.split(line):
        word = fill.get(word, word)
        argv += sorted(glob.glob(str(cwd / word))) if "*" in word else [word]
    return subprocess.run([sys.executable, "-m", "campaign.cli", *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, input=ANSWERS.get(line, ""))


def test_the_using_it_block_works_as_printed(workspace: tuple[Path, dict[str, str], dict[str, str]]) -> None:
    cwd, env, fill = workspace
    lines = using_it_block()
    assert lines[0].startswith("campaign validate") and "campaign submit examples/local.yaml" in lines
    # The demo campaign first (the block's own line), so that every line about it has it.
    first = run_line("campaign submit examples/local.yaml", cwd, env, fill)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    ran = []
    for printed in lines:
        for line in expand(printed):
            filled = " ".join(fill.get(w, w) for w in line.split())
            r = run_line(line, cwd, env, fill)
            code, said = REFUSALS.get(filled, (0, ""))
            assert r.returncode == code, f"{line!r}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
            assert said in r.stdout + r.stderr, f"{line!r}: {r.stdout[-2000:]}\n{r.stderr[-2000:]}"
            assert "Traceback" not in r.stderr, f"{line!r}: {r.stderr}"
            ran.append(line)
    assert "campaign nodes exclude local-n9" not in ran  # placeholders are filled at run time, not in `ran`
    assert {"campaign nodes list", "campaign nodes exclude NODE", "campaign nodes include NODE",
            "campaign status local-demo --json", "campaign status local-demo --watch",
            "campaign logs local-demo -f"} <= set(ran)
    assert (cwd / "data.bin").stat().st_size > 0 and list((cwd / "plots").glob("local-demo-*.png"))
