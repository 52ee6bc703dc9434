"""Learning that shows, measured truthfully on held-out rows: what a short CPU run of the shipped `tiny` recipe learns.

- On real text (ten English Wikipedia shards from ../shared; skipped with the reason when absent): 600 steps through
  the real command line (a step budget: no wall-clock assertion) leave the generator well above the unigram answer,
  context learned through the generator. The discriminator shows no context at this compute (its AUCs matched by
  token id stay at 0.5), and it does not beat its all-original prior: the verdict says "context through the
  generator" and nothing more.
- On a synthetic grammar generated here (word classes in fixed orders, words Zipf-distributed inside a class, so only
  the neighbours tell a masked word's class): 500 steps of the recipe as shipped, the generator at least twice the
  unigram answer. It needs no data from outside and failed with the recipe shipped before (peak lr 1e-4).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("TINYELECTRA_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
ENWIKI_SHARDS = sorted((SHARED / "enwiki").glob("AA_wiki_0[0-9].gz"))
STEPS = 600  # 600 x 16 x 128 = 1.2M token slots: the ten shards' 1.5M training tokens seen less than once
EVAL_ROWS = 512  # asked for; ten shards with 3% of the documents held out give 328 rows (8 documents)
# Margins with room under what this exact run measured on three seeds (see
# test_short_run_learns_context_through_the_generator)
GEN_OVER_UNIGRAM = 2.2  # held-out generator accuracy over the unigram answer's
GEN_LOSS_BELOW_UNIFORM = 2.2  # nats under ln(8,192) = 9.01, the loss of a uniform guess


def run_cli(args: list[str], env: dict) -> None:
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                       timeout=3600)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.cli
def test_short_run_learns_context_through_the_generator(tmp_path):
    """tiny as shipped, 600 steps of 16 x 128 on ten enwiki shards (vocabulary 8,192, 328 held-out rows), measured on a
    2-core CPU for seeds 0 (the default, this test), 1 and 2 (benchmarks/lab/results/short_runs_seeds_cpu.md): generator
    accuracy 0.148, 0.141, 0.137 against the unigram answer's 0.053 (2.79x, 2.66x, 2.59x), loss 6.35, 6.38, 6.41 nats
    (uniform: 9.01). The discriminator: AUCs matched by token id 0.49-0.51 on its generator's fakes and on unigram
    draws (no context), accuracy exactly its all-original prior (+0.0000): it answers "original" everywhere once the
    generator's words are no longer odd. Before the peak rate went from 1e-4 to 3e-3 this run measured the opposite
    (generator 1.00x the unigram answer; discriminator +0.0115 over its prior by spotting the weak generator's odd
    words, matched AUCs 0.52/0.51), and this test asserted that."""
    if not ENWIKI_SHARDS:
        pytest.skip(f"needs ten English Wikipedia shards in {SHARED}/enwiki (set TINYELECTRA_SHARED_DATA)")
    env = dict(os.environ, TINYELECTRA_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    data, run = tmp_path / "enwiki10", tmp_path / "run"
    run_cli(["prepare", "--corpus", *map(str, ENWIKI_SHARDS), "--out", str(data), "--vocab-size", "8192",
             "--workers", "1", "--validation-fraction", "0.03"], env)
    run_cli(["train", "--recipe", "tiny", "--data", str(data), "--budget", f"{STEPS}steps", "--device", "cpu",
             "--out", str(run), "--set", f"train.eval_rows={EVAL_ROWS}"], env)
    held_out = json.loads((data / "manifest.json").read_text())["splits"]["validation"]["rows"]
    final = json.loads((run / "ckpt-10000" / "meta.json").read_text())["eval"]
    assert final["rows"] == min(EVAL_ROWS, held_out) >= 300
    assert final["gen_acc"] >= GEN_OVER_UNIGRAM * final["unigram_acc"], final
    assert final["gen_loss"] <= math.log(8192) - GEN_LOSS_BELOW_UNIFORM, final
    assert final["learned"] and "context through the generator" in final["learning"]
    assert all(0.0 <= final[k] <= 1.0 for k in ("disc_auc_matched", "disc_auc_context_matched"))
    plan = json.loads((run / "plan.json").read_text())
    assert plan["warmup_steps"] == STEPS // 2  # the paper's Adam: min(1 / (1 - beta2), half the run)

# The synthetic grammar: six word classes, each sentence the six classes in one of three fixed orders, 24 made-up
# words per class drawn by Zipf's law (weight 1 / rank). A masked word's class shows only in its neighbours; knowing
# it, the best answer (the class's first word) is right 1 / H(24) = 26% of the time, against about 26% / 6 = 4.4%
# for the unigram answer (the most frequent word overall).
CLASSES, WORDS_PER_CLASS = 6, 24
ORDERS = [(0, 1, 2, 3, 4, 5), (0, 2, 1, 3, 5, 4), (3, 4, 5, 0, 1, 2)]
GRAMMAR_STEPS = 500


def grammar_corpus(path: Path, documents: int = 4000, sentences: int = 10, seed: int = 0) -> list[str]:
    """Write the corpus (blank lines between documents, a sentence per line); return its words."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = rng.sample([a + b for a, b in itertools.product(syllables, syllables)], CLASSES * WORDS_PER_CLASS)
    lexicon = [words[c * WORDS_PER_CLASS:(c + 1) * WORDS_PER_CLASS] for c in range(CLASSES)]
    zipf = [1.0 / rank for rank in range(1, WORDS_PER_CLASS + 1)]
    docs = ("\n".join(" ".join(rng.choices(lexicon[c], zipf)[0] for c in rng.choice(ORDERS)) for _ in range(sentences))
            for _ in range(documents))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return words


@pytest.mark.slow
@pytest.mark.cli
def test_generator_learns_a_grammars_context(tmp_path):
    """The whole trainer learns context, in minutes: a corpus generated here (above), prepared and trained through
    the command line with the tiny recipe as shipped, only the data-derived settings changed (32-token rows, the
    512-entry vocabulary the words need: each one a single token), for 500 steps. The generator's held-out accuracy
    must reach at least twice the unigram answer's. Measured on this project's 2-core CPU beside other work (one
    thread; 107 s of training, 132 s for the whole test): 0.210 vs 0.050 (4.2x) with the shipped recipe (peak lr 3e-3),
    0.095 (1.9x) at step 125, 0.155 (3.1x) at 250; with the recipe shipped before (lr 1e-4) 0.052 vs 0.050, and this
    test failed."""
    env = dict(os.environ, TINYELECTRA_CACHE=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    corpus, data, run = tmp_path / "grammar.txt", tmp_path / "grammar", tmp_path / "run"
    words = grammar_corpus(corpus)
    run_cli(["prepare", "--corpus", str(corpus), "--out", str(data), "--vocab-size", "512", "--seq-len", "32",
             "--workers", "1", "--validation-fraction", "0.05"], env)
    assert set(words) <= set((data / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").split())  # whole words
    run_cli(["train", "--recipe", "tiny", "--data", str(data), "--budget", f"{GRAMMAR_STEPS}steps", "--device", "cpu",
             "--out", str(run), "--set", "train.seq_len=32"], env)
    final = json.loads((run / "ckpt-10000" / "meta.json").read_text())["eval"]
    assert final["rows"] >= 200
    assert final["gen_acc"] >= 2 * final["unigram_acc"], final
    assert "context through the generator" in final["learning"]
